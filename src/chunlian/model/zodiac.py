"""The zodiac year: generated lines name no other year's animal.

The corpora hold couplets written for many New Years, so the model happily writes 金猴献岁
(the Monkey's year) or 蛇岁迎春 for any 上联: on the validation split 186 of 2,000 greedy
下联 held a zodiac animal, and lines such as 紫燕迎春 -> 金猴献岁 name the wrong year for a
2027 campaign (the Goat's). So the terms that name a year by its animal - ``A年``, ``A岁``,
the epithet ``金A`` and its earthly branch's year (辰年 for 龙年) - are banned in generated text
for every animal but the campaign year's and the year it follows (辞旧迎新: 欢送马年 -> 喜迎羊岁);
the year it follows is never greeted as the year (马岁, which blind readers reject). An 上联 that
names the year (羊年吉祥喜洋洋) draws a 下联 that pairs 年 with 日 or 月 and 羊 with another
animal (猴日顺意福满满, 迎虎之岁), or the year's stem-branch name with another year's (丁未 ->
丙申): so ``A日``, ``A月``, ``A之岁``, ``A之年`` of every animal but the year's, and every
stem-branch name but the year's, the previous one's and 甲子 (sixty years, a cycle), are banned
too. Through the same machinery as the safety blocklist (``model.decoding``: bans at every step,
lookahead included). Banned words alone move the animal elsewhere (猴日 -> 猴棒, 虎夜), so a
下联 for an 上联 that holds the year's animal writes no other animal at all
(``answering_animals``).

A composed couplet (a name's, ``with_composed``) is stricter: it names the year only by its
own animal. The previous year's animal may go (马去羊来) but is never the year's (马岁, 马年),
and no other animal greets the spring (骏马迎春, 玉兔呈祥, 大圣迎春, 猴日顺意), as blind
readers took each of those for the wrong year.

Only generation is constrained: a user's 上联 may name any year, and animals in their other
senses (龙腾虎跃, 马到成功, 三羊开泰) stay free. The year is ``Settings.zodiac_year``; by
default the coming Spring Festival's (``campaign_year``).
"""

from __future__ import annotations

import datetime as dt
from functools import lru_cache

from chunlian.data.blocklist import Blocklist

ANIMALS = "鼠牛虎兔龙蛇马羊猴鸡狗猪"  # 2020 was a Rat year
# each animal's earthly branch: 辰年 is the Dragon's year as 龙年 is
EARTHLY = "子丑寅卯辰巳午未申酉戌亥"
BRANCHES = dict(zip(ANIMALS, EARTHLY, strict=True))
ALIASES = {"狗": "犬"}  # 犬年, 犬岁, 金犬 name the Dog's year too
YEAR_PATTERNS = ("{}年", "{}岁", "金{}")
# how a 下联 answers an 上联's 羊年 with another animal: every animal but the year's
PAIRED_PATTERNS = ("{}日", "{}月", "{}之岁", "{}之年")
STEMS = "甲乙丙丁戊己庚辛壬癸"


def animal(year: int) -> str:
    """The zodiac animal of the lunar year that starts in ``year`` (2027: 羊)."""
    return ANIMALS[(year - 2020) % 12]


def campaign_year(today: dt.date) -> int:
    """The year of the coming Spring Festival: from June on, next year's (it falls between
    21 January and 20 February)."""
    return today.year + 1 if today.month >= 6 else today.year


def branch_years(animal_: str) -> list[str]:
    """The term naming ``animal_``'s year by its earthly branch (辰年), none for the Rat's:
    子年 is mostly 学子年年, 赤子年华."""
    branch = BRANCHES[animal_]
    return [] if branch == "子" else [branch + "年"]


def other_animals(year: int) -> list[str]:
    """Every animal but ``year``'s, with the aliases of those (犬 unless it is the Dog's year)."""
    others = [a for a in ANIMALS if a != animal(year)]
    return others + [ALIASES[a] for a in others if a in ALIASES]


def stem_branch(year: int) -> str:
    """The sexagenary name of the lunar year that starts in ``year`` (2027: 丁未)."""
    return STEMS[(year - 4) % 10] + EARTHLY[(year - 4) % 12]


def off_year_terms(year: int) -> frozenset[str]:
    """Terms naming a zodiac year other than ``year``'s and the year before it, the year
    before it greeted as the year (马岁: 欢送马年 -> 喜迎羊岁 stays, 马岁小康 does not), and
    another animal or stem-branch name answering the year's (module docstring)."""
    prev = animal(year - 1)
    names = [a for a in ANIMALS if a not in {animal(year), prev}]
    branches = [t for a in names for t in branch_years(a)]
    names += [ALIASES[a] for a in names if a in ALIASES]
    greeted = [f"{prev}岁"] + ([f"{ALIASES[prev]}岁"] if prev in ALIASES else [])
    paired = [p.format(a) for a in other_animals(year) for p in PAIRED_PATTERNS]
    cycle = {stem_branch(y) for y in range(year, year + 60)} - {stem_branch(year), stem_branch(year - 1), "甲子"}
    return frozenset([p.format(a) for a in names for p in YEAR_PATTERNS] + branches + greeted + paired + sorted(cycle))


def answering_animals(upper: str, year: int | None) -> frozenset[str]:
    """The animals a 下联 of ``upper`` may not write: every other one (and 犬) when ``upper``
    holds ``year``'s animal, as one there pairs with it as another year; else none."""
    if year is None or not {animal(year), ALIASES.get(animal(year))} & set(upper):
        return frozenset()
    return frozenset(other_animals(year))


@lru_cache(maxsize=8)  # one object per (list, year): its indexes (``model.decoding``) are built once
def with_zodiac(blocklist: Blocklist, year: int | None) -> Blocklist:
    """``blocklist`` plus the off-year terms of ``year`` (None: ``blocklist`` as it is)."""
    if year is None:
        return blocklist
    return Blocklist(set(blocklist.terms) | off_year_terms(year), zodiac_year=year)


# how the model has another animal greet the year in a composed line: A迎春, A呈祥, ...
GREETING_PATTERNS = ("{}迎春", "{}报春", "{}献岁", "{}贺岁", "{}呈祥", "{}献瑞", "{}送福", "{}日")
# epithets that stand for an animal without naming it: the rabbit's and the monkey's
EPITHETS = {"兔": ("玉兔",), "猴": ("大圣", "灵猴", "美猴", "神猴")}


def composed_terms(year: int) -> frozenset[str]:
    """Terms a composed couplet for ``year`` may not write beyond ``off_year_terms``: the
    previous year's animal as the year, and every other animal greeting it."""
    prev = animal(year - 1)
    others = other_animals(year)
    terms = {p.format(prev) for p in YEAR_PATTERNS} | set(branch_years(prev))
    terms |= {p.format(a) for a in others for p in GREETING_PATTERNS}
    terms |= {e for a in others for e in EPITHETS.get(a, ())}
    return frozenset(terms)


def with_composed(blocklist: Blocklist, year: int | None) -> Blocklist:
    """``blocklist`` plus ``composed_terms(year)`` (None: ``blocklist`` as it is)."""
    if year is None:
        return blocklist
    return Blocklist(set(blocklist.terms) | composed_terms(year), zodiac_year=year)
