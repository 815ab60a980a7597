"""Text rules shared by the data pipeline, the decoder and the API.

A couplet line is a string of Han characters, optionally split into clauses by Chinese
punctuation. Everything here is pure Python and cheap: it runs on every request.
"""

from __future__ import annotations

import re
from functools import lru_cache

from chunlian.errors import InvalidInput

MAX_LINE_CHARS = 32

# Punctuation allowed inside a line (clause separators); ASCII and half-width forms are
# folded onto these by ``normalize``.
CLAUSE_PUNCT = frozenset("，、；：！？。")
_FOLD = str.maketrans({",": "，", ";": "；", ":": "：", "!": "！", "?": "？", "．": "。", "､": "、", "｡": "。"})
_STRIP = " \t\r\n\u3000\u200b\ufeff"


_HAN_CLASS = "\u4e00-\u9fff\u3400-\u4dbf"  # the ranges of ``is_han``
# A line that is already normal and passes every rule of ``validate_upper``: Han at both
# ends, at most one punctuation mark between Han characters. Checked first because almost
# every request is such a line; anything else takes the rule-by-rule path, which names
# the problem.
_VALID_LINE = re.compile(f"[{_HAN_CLASS}](?:[{''.join(sorted(CLAUSE_PUNCT))}]?[{_HAN_CLASS}])*")


def is_han(ch: str) -> bool:
    """True for a CJK unified ideograph (basic block and extension A)."""
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF


def normalize(text: str) -> str:
    """NFKC-free normalisation: fold punctuation to full width, drop all whitespace.

    NFKC is not used because it would turn full-width Chinese punctuation into ASCII.
    """
    text = text.translate(_FOLD)
    return "".join(ch for ch in text if ch not in _STRIP and not ch.isspace())


def punct_positions(line: str) -> tuple[tuple[int, str], ...]:
    """The (index, char) of every non-Han character: the line's clause structure."""
    return tuple((i, ch) for i, ch in enumerate(line) if not is_han(ch))


def han_count(line: str) -> int:
    return sum(1 for ch in line if is_han(ch))


def validate_upper(raw: object, field: str = "upper") -> str:
    """Normalise and check a user-supplied 上联; raise ``InvalidInput`` naming the problem."""
    if not isinstance(raw, str):
        raise InvalidInput(f"{field} must be a string", field)
    if len(raw) <= MAX_LINE_CHARS and _VALID_LINE.fullmatch(raw):
        return raw  # normal already (no whitespace, nothing to fold) and valid
    return _checked_line(raw, field)


def _checked_line(raw: str, field: str) -> str:
    """``validate_upper`` rule by rule: the normalised line, or the first problem named."""
    line = normalize(raw)
    if not line:
        raise InvalidInput(f"{field} is empty", field)
    if len(line) > MAX_LINE_CHARS:
        raise InvalidInput(
            f"{field} is too long: {len(line)} characters, at most {MAX_LINE_CHARS}", field
        )
    bad = [ch for ch in line if not is_han(ch) and ch not in CLAUSE_PUNCT]
    if bad:
        shown = "".join(dict.fromkeys(bad))[:8]
        raise InvalidInput(
            f"{field} must be Chinese characters (with ，、；：！？。 between clauses); "
            f"found {shown!r}",
            field,
        )
    if not is_han(line[0]) or not is_han(line[-1]):
        raise InvalidInput(f"{field} must begin and end with a Chinese character", field)
    for a, b in zip(line, line[1:], strict=False):
        if not is_han(a) and not is_han(b):
            raise InvalidInput(f"{field} has two punctuation marks in a row", field)
    return line


@lru_cache(maxsize=65536)
def tone_class(ch: str) -> str:
    """'ping' (tones 1-2), 'ze' (tones 3-4) or '' (neutral, unknown, non-Han).

    Modern Mandarin tones from pypinyin: good enough for a rule check, not for classical
    entering tones (入声) or polyphones (the first reading is used).
    """
    if not is_han(ch):
        return ""
    from pypinyin import Style, pinyin

    reading = pinyin(ch, style=Style.TONE3, heteronym=False, errors="ignore")
    if not reading or not reading[0]:
        return ""
    tone = reading[0][0][-1:]
    if tone in ("1", "2"):
        return "ping"
    if tone in ("3", "4"):
        return "ze"
    return ""


@lru_cache(maxsize=16384)
def checked_positions(line: str) -> tuple[int, ...]:
    """Positions whose 平仄 should oppose: within each clause (split at non-Han characters),
    the even positions (1-based from the clause start) and the clause's last character."""
    out: list[int] = []
    start = 0
    for i in range(len(line) + 1):
        if i == len(line) or not is_han(line[i]):
            if i > start:
                out.extend(p for p in range(start, i) if (p - start + 1) % 2 == 0)
                if (i - 1) not in out:
                    out.append(i - 1)
            start = i + 1
    return tuple(sorted(set(out)))
