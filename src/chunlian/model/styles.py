"""The closed set of couplet styles and their lexicons.

No public corpus labels couplets by style, so a training pair's style is *derived*: the
style whose lexicon its two lines hit most (ties and no hits -> ``general``). At inference
the style is carried twice: by the style token the model was trained with, and by a small
logit bonus on the style's lexicon characters (``STYLE_BIAS``), so the choice of style
visibly changes the output even for upper lines that sit between registers.

| style | 中文 | for |
|---|---|---|
| traditional | 传统 | Spring Festival greetings: spring, the new year, luck, plum blossom |
| business | 商贸/财运 | shops and companies: wealth, trade, prosperity |
| family | 家庭/平安 | homes: peace, health, harmony, long life, children |
| literary | 文雅 | scholars: landscape, poetry, ink, the moon |
"""

from __future__ import annotations

STYLES: tuple[str, ...] = ("traditional", "business", "family", "literary")
TRAIN_ONLY_STYLES: tuple[str, ...] = ("general",)
STYLE_NAMES_ZH = {"traditional": "传统", "business": "商贸", "family": "家庭", "literary": "文雅"}

LEXICONS: dict[str, str] = {
    "traditional": "春年岁新喜福瑞梅迎辞旧吉祥庆贺红灯爆竹桃符雪丰除夕元旦佳节开泰升平盛世祖国东风燕柳晖",
    "business": "财富商贾利市生意兴隆金银宝贵通达客源货盈广进聚鸿鑫昌旺店铺业",
    "family": "家安康寿和睦亲孝儿孙子女老幼满堂庭门户团圆健乐居宅室父母慈暖同心平",
    "literary": "诗书墨文章琴棋画砚笔山水月云风雨松竹兰菊鹤舟江湖烟霞泉石楼亭雅志学韵",
}

# Added to the logits of the chosen style's lexicon characters at Han positions.
STYLE_BIAS = 0.0


def derive_style(upper: str, lower: str, register: str) -> str:
    """The training style of a pair: the lexicon it hits most, else ``general``."""
    text = upper + lower
    best, best_hits = "general", 0
    for style in STYLES:
        hits = sum(text.count(ch) for ch in LEXICONS[style])
        if hits > best_hits:
            best, best_hits = style, hits
    if register == "classical" and best in ("general", "traditional"):
        # Regulated verse is literary by register whatever its words.
        return "literary"
    return best


def lexicon_hit_rate(lines: list[str], style: str) -> float:
    """Share of Han characters in ``lines`` that belong to ``style``'s lexicon."""
    lex = set(LEXICONS[style])
    total = sum(len(s) for s in lines)
    return sum(1 for s in lines for ch in s if ch in lex) / total if total else 0.0
