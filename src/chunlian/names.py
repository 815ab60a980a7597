"""Names in a 藏头 couplet: which characters of a typed name head the two lines, and what a
name's head may not be followed by (pure Python, no model).

The convention (``line_heads``), documented in ``docs/reference/http-api.md``:

* a 1-character name heads the 上联 (the 下联 is free);
* a 2-character name heads both lines, in order: 王伟 → 王… / 伟…;
* a 3- or 4-character name: its given name heads both lines and the surname is not written
  into them: 王秀英 → 秀… / 英…, 欧阳娜娜 → 娜… / 娜…. A given name is what a family calls
  the person; a surname is shared by a hundred million others, would open a third of all
  answers with the same few characters (王, 李, 张), and is where insulting readings come from
  (胡 → 胡言, 吴 → 无). A compound surname (``COMPOUND_SURNAMES``) is recognised, so
  欧阳修's given name is 修 (one head);
* a repeated character (丹丹, 王丹丹) heads both lines: the one character the 下联 shares
  with the 上联, a deliberate exception to the couplet rule that the lines share none.

What a head may not be followed by (``banned_after_head``): a line that opens with a name
must never read as an insult of it. ``HEAD_NEGATIVE`` lists, per head character, the
continuations that turn it into a negative word (胡 + 言 = 胡言 "nonsense"), and
``NEAR_HEAD_NEGATIVE`` the characters of death, illness, poverty and insult that may not
stand right after a name's head in either line. Both were drawn from the answers for the
500 most common names (``docs/guides/campaign-page.md``, "Names"): small lists, since a
ban costs the model a choice at the one place where the name leaves it one.

A head character the corpus rarely opens a word with (娜, 婷, 玲) invites an invented word
(娜郎, 婷角, 玲水): where ``HEAD_WORDS`` (``resources/head_words.tsv``, built by
``scripts/build_head_words.py`` from the training pairs) lists what follows a head, the
character after it must be one of those (``allowed_after_head``).

A composed couplet hangs on a family's door under their name, so its lines, 上联 and 下联,
keep a festive register (``FESTIVE_BANNED_CHARS``, ``FESTIVE_BANNED_TERMS``): no grief, blood
or ageing (千古恨, 万年愁, 血染, 无常, 花已落, 红颜老), and no allusion that mocks a surname
(刘伶 the drunkard, 梁上 of 梁上君子 the thief, 冯唐 of 冯唐易老) or turns it into someone
else's (王母: the line is then about the goddess), nor the stock templates' 风流 and 千古.
Drawn from the blind read of the 200 most common names (``docs/guides/campaign-page.md``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from chunlian.text import is_han

# the common two-character surnames (a 3-character name that starts with one has a
# one-character given name)
COMPOUND_SURNAMES = frozenset(["欧阳", "司马", "上官", "诸葛", "东方", "皇甫", "尉迟", "公孙", "慕容", "长孙", "夏侯", "令狐", "宇文", "澹台", "轩辕", "西门", "司徒", "端木", "独孤", "南宫", "万俟", "闻人", "呼延", "申屠", "钟离", "百里", "东郭", "太史", "第五"])

# head character -> the characters that, right after it, make a negative word. Written
# as the words themselves; a word applies to any name its first character heads. Drawn from
# the answers for the 500 most common names (fast and best: 可怜, 超生, 付水 (付之流水),
# 叶落) and the issue's report (胡言 for 胡军), with the rest of 胡's family of "nonsense".
_NEGATIVE_WORDS = ["胡言", "胡说", "胡闹", "胡扯", "胡来", "胡乱", "胡诌", "可怜", "超生", "付水", "叶落"]
HEAD_NEGATIVE: dict[str, frozenset[str]] = {}
for _w in _NEGATIVE_WORDS:
    HEAD_NEGATIVE[_w[0]] = HEAD_NEGATIVE.get(_w[0], frozenset()) | {_w[1]}

# never right after a name's head, whatever the head: death, illness, poverty, loss and
# the animals that insult a person (the answers held 静鸡, and 娜婆 / 婷婆 for young women)
NEAR_HEAD_NEGATIVE = frozenset("死亡丧病穷贫败衰孤寡残鸡狗猪婆")


# never in a composed line: grief, tears, blood, cold, death and ageing, which the model
# writes in its stock name templates (王子风流千古恨 / 伟人浪漫万年愁, 军人血染, 夜光寒)
FESTIVE_BANNED_CHARS = frozenset("恨愁悲泪血哀怨伤殇哭泣痛惨孤寡死丧坟墓鬼寒")
# words of the same kind whose characters are innocent alone (千古 is what a memorial
# scroll writes after a name), 风流 (amorous, and the core of the templates 王子风流千古恨,
# 宋代风流千古事, 赵氏风流人不老 that the model writes for any surname), and allusions that
# mock a surname or make it someone else's: 刘伶 the drunkard, 梁上 (君子, the thief), 冯唐
# (易老, the talent never used), 王母 (the goddess); and the famous people a surname opens
# (李白, 韩信, 吕布, 阎罗, 孙行者, 郑板桥), whose lines the model writes for every name of
# that surname and which are then about them, and 熊市 (a bear market); 出墙 (红杏出墙: a
# wife's infidelity) and 伟人 (the Great Man: what the model opens 伟's 下联 with, read as
# grandiose or as Mao)
FESTIVE_BANNED_TERMS = frozenset([
    "无常", "花已", "已落", "花落", "落花", "寂寞", "白发", "颜老", "风老", "人老", "无力", "生死",
    "千古", "风流", "刘伶", "梁上", "冯唐", "王母", "陈年旧", "出墙", "伟人", "熊市",
    "李白", "杜甫", "王维", "苏轼", "贾岛", "陶潜", "屈原", "韩信", "吕布", "孟德", "曹操", "刘邦",
    "项羽", "孙权", "周瑜", "关羽", "岳飞", "秦桧", "董卓", "潘安", "潘金", "西门", "高俅", "和珅",
    "严嵩", "赵高", "包拯", "宋江", "武松", "阎罗", "孙行", "冯夷", "尹文", "董老", "郑板", "袁安",
    "刘海", "刘备", "韩愈", "李杜", "郑老", "孔明", "杜牧", "白居", "李清", "苏东", "王羲",
])
# never right after the 上联's head (a 2-character name's surname): what makes it a
# person, a title, a clan or a dynasty. The model's stock 上联 for a surname reads it so
# (王子风流 / 王者不知天下事, 刘公已是春秋事, 刘郎, 宋代, 郑国, 赵氏, 冯公, 邓公) and is then
# about someone else, with the same line for every given name; read in its own sense the
# character opens lines a family hangs (张灯结彩, 黄梅傲雪, 高歌盛世, 何处春风)
NOT_A_PERSON = frozenset("子者公郎氏代国朝君王帝侯伶")
# a head must have at least this many attested continuations for the rule to apply: one
# or two would leave the model a forced and often meaningless word
MIN_HEAD_WORDS = 3


@lru_cache(maxsize=1)
def head_words() -> dict[str, str]:
    """head -> the characters that follow it inside a line of the training pairs."""
    text = (Path(__file__).resolve().parent / "resources" / "head_words.tsv").read_text(encoding="utf-8")
    return dict(ln.split("\t", 1) for ln in text.splitlines() if "\t" in ln)


@lru_cache(maxsize=4096)  # one set per head: ``model.decoding`` caches its mask by the set
def allowed_after_head(head: str) -> frozenset[str] | None:
    """What may follow the name character ``head`` in a line it opens (None: anything the
    other rules allow; the head has too few attested words)."""
    words = head_words().get(head, "")
    return frozenset(words) if len(words) >= MIN_HEAD_WORDS else None


def given_name(name: str) -> str:
    """The given name of a full name: after a compound surname (or the first two of four
    characters), else after the first character; a 1- or 2-character name is returned
    whole (both its characters head)."""
    if len(name) <= 2:
        return name
    if len(name) == 4 or name[:2] in COMPOUND_SURNAMES:
        return name[2:]
    return name[1:]


def line_heads(name: str) -> str:
    """The characters that head the 上联 and the 下联 for ``name`` (1-4 Han characters,
    already validated): at most two, the second heading the 下联 (module docstring)."""
    heads = given_name(name)
    return heads[:2]


def banned_after_head(head: str) -> frozenset[str]:
    """The characters a line that opens with the name character ``head`` may not put next."""
    if not is_han(head):
        return frozenset()
    return HEAD_NEGATIVE.get(head, frozenset()) | NEAR_HEAD_NEGATIVE
