"""Write data/campaign/names.tsv: common Chinese full names, ranked, for the campaign set.

    python scripts/build_campaign_names.py          # rewrite the file
    python scripts/build_campaign_names.py --check  # exit 1 when the file differs

The ranking is an estimate, not a count: no name-frequency table is reachable where this was
written, so the lists below were written from the published 公安部户籍管理研究中心《全国姓名
报告》(2019 and 2020 editions) and the lists of most duplicated names circulated from earlier
editions, as remembered, with their order kept where it was remembered. How they combine:

1. ``REPORTED``: the most duplicated full names as those lists give them, in their order.
2. ``ISSUE``: the names issue #55 cites (王伟 is already in 1), so every one is in the set.
3. Then surname x given name, ranked by the product of the two ranks (a surname's and a given
   name's frequencies are roughly independent and Zipf-like, so the product orders the pairs
   by estimated frequency); 2-character names (single given name) and 3-character names
   (double given name) come from two pools, and a 3-character name is taken whenever they are
   under a third of the list so far (about a third of people have a double given name).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "campaign" / "names.tsv"
TOTAL = 600


def words(text: str) -> list[str]:
    return text.split()



REPORTED = words(
    "张伟 王伟 王芳 李伟 李娜 张敏 李静 王静 刘伟 王秀英 张丽 李秀英 王丽 张静 张秀英 李强 "
    "王敏 李敏 王磊 刘洋 王艳 王勇 李军 张勇 李杰 张杰 张磊 王强 李娟 王军 张艳 张涛 王涛 "
    "李艳 王超 李明 李勇 王娟 刘杰 刘敏 李霞 李丽 张军 王杰 张强 王秀兰 王刚 王平 刘芳 张燕 "
    "刘艳 刘军 李平 王辉 王燕 陈静 刘勇 李玲 李桂英 王丹 李刚 李丹 李萍 王鹏 刘涛 陈伟 张华 "
    "刘静 李涛 王桂英 张秀兰 李红 李超 刘丽 张桂英 王玉兰 李燕 张鹏 李秀兰 张超 王凤英 王玲 "
    "张玲 李华 王霞"
)
ISSUE = words("杨帆 李建国 王建军 王丹丹 朱婷 胡军")

# the 2020 report's top 100 surnames; the order beyond the first twenty is approximate
SURNAMES = (
    "王李张刘陈杨黄赵吴周徐孙马胡朱郭何罗高林郑梁谢唐许冯宋韩邓彭曹曾田于肖潘袁董叶杜丁蒋"
    "程余吕魏蔡苏任卢沈姜姚钟崔陆谭汪石付贾范金方韦夏廖侯白孟邹秦尹江熊薛邱阎段雷季史陶毛"
    "贺龙万顾关郝孔向龚邵钱武"
)
# single given names, most common first (older generations weigh most in a population count)
SINGLE = (
    "伟芳娜敏静丽强磊军洋勇艳杰娟涛明超霞平刚燕辉玲丹萍鹏华红飞婷宇浩凯鑫斌波琳晶颖倩帆林"
    "欣悦博阳晨雪峰健亮俊宁琴云蓉莉梅兰东"
)
# double given names: the older generations' most common, then the newborn top tens of the
# 2019 and 2020 reports, with the repeated names (丹丹, 婷婷) common among the 1980s born
DOUBLE = words(
    "秀英 秀兰 桂英 建华 玉兰 建国 建军 桂兰 凤英 秀珍 海燕 丹丹 婷婷 玉梅 丽娟 志强 国强 晓东 "
    "志刚 春梅 海涛 丽华 红梅 秀云 俊杰 晶晶 欣怡 子涵 浩然 宇轩 一诺 梓涵 雨桐 子轩 浩宇 诗涵 "
    "奕辰 梓萱 欣妍 莉莉 佳佳 可馨 依诺 宇航 子墨 一鸣 思远 佳怡 雨欣 博文 天宇 欢欢 建平 淑珍 "
    "玉珍 文静 晓燕 志明 国华 金凤"
)


def pool(givens: list[str]) -> Iterator[str]:
    """Surname x given name, by the product of their ranks (ties: the surname's rank first)."""
    pairs = [(rs * rg, rs, rg) for rs in range(1, len(SURNAMES) + 1)
             for rg in range(1, len(givens) + 1)]
    for _, rs, rg in sorted(pairs):
        yield SURNAMES[rs - 1] + givens[rg - 1]


def build(total: int = TOTAL) -> list[tuple[str, str]]:
    """(name, origin) pairs, most common first."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(name: str, origin: str) -> None:
        if name not in seen:
            seen.add(name)
            out.append((name, origin))

    for name in REPORTED:
        add(name, "reported")
    for name in ISSUE:
        add(name, "issue")
    twos, threes = pool(list(SINGLE)), pool(DOUBLE)
    while len(out) < total:
        three_share = sum(len(n) == 3 for n, _ in out) / len(out)
        add(next(threes if three_share < 1 / 3 else twos), "constructed")
    return out


def render(names: list[tuple[str, str]]) -> str:
    rows = ["rank\tname\tchars\torigin"]
    rows += [f"{i}\t{name}\t{len(name)}\t{origin}" for i, (name, origin) in enumerate(names, 1)]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when names.tsv is stale")
    args = ap.parse_args(argv)
    text = render(build())
    if args.check:
        stale = not OUT.is_file() or OUT.read_text(encoding="utf-8") != text
        print(f"{OUT} is stale" if stale else f"{OUT} is current")
        return 1 if stale else 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
