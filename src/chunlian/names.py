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
"""

from __future__ import annotations

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
