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
_FOLD = str.maketrans({",": "，", ";": "；", ":": "：", "!": "！", "?": "？", ".": "。", "．": "。",
                       "､": "、", "｡": "。"})
_STRIP = " \t\r\n\u3000\u200b\ufeff"

# Two-character marks a 上联 may hold between clauses: the dash and the ellipsis. The model
# knows only the one-character clause punctuation above, so it reads each as a "，"
# (``model_form``) and the answer gets the typed mark back at the same place
# (``with_typed_marks``). The data pipeline drops pairs that hold them (not clause
# punctuation: ``data.corpus``).
DASH, ELLIPSIS = "——", "……"
LONG_MARKS = (DASH, ELLIPSIS)
_MODEL_MARK = "，"
# the spellings people type for them (matched longest first): a lone —, --, －－, ──, ――
# and a lone ― (what some GBK input methods write) for the dash; a lone …, six or three
# ASCII dots for the ellipsis (folded before a single "." becomes "。")
_LONG_FOLD = {"——": DASH, "—": DASH, "--": DASH, "－－": DASH, "──": DASH, "――": DASH,
              "―": DASH, "……": ELLIPSIS, "…": ELLIPSIS, "......": ELLIPSIS, "...": ELLIPSIS}
_LONG_SPELLINGS = re.compile("|".join(re.escape(s) for s in sorted(_LONG_FOLD, key=len, reverse=True)))
_LONG_FIRST = frozenset(s[0] for s in _LONG_FOLD)


_HAN_CLASS = "\u4e00-\u9fff\u3400-\u4dbf"  # the ranges of ``is_han``
# A line that is already normal and passes every rule of ``validate_upper``: Han at both
# ends, at most one punctuation mark (or one ——, ……) between Han characters. Checked first
# because almost every request is such a line; anything else takes the rule-by-rule path,
# which names the problem.
_VALID_LINE = re.compile(
    f"[{_HAN_CLASS}](?:(?:[{''.join(sorted(CLAUSE_PUNCT))}]|{DASH}|{ELLIPSIS})?[{_HAN_CLASS}])*"
)


def is_han(ch: str) -> bool:
    """True for a CJK unified ideograph (basic block and extension A)."""
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF


def normalize(text: str) -> str:
    """NFKC-free normalisation: drop all whitespace, fold the typed dash and ellipsis
    spellings to ``——`` / ``……`` and the other punctuation to full width.

    NFKC is not used because it would turn full-width Chinese punctuation into ASCII.
    """
    text = "".join(ch for ch in text if ch not in _STRIP and not ch.isspace())
    if not _LONG_FIRST.isdisjoint(text):
        text = _LONG_SPELLINGS.sub(lambda m: _LONG_FOLD[m.group()], text)
    return text.translate(_FOLD)


def model_form(line: str) -> str:
    """``line`` as the model reads it: each ``——`` / ``……`` one clause mark ("，")."""
    for mark in LONG_MARKS:
        line = line.replace(mark, _MODEL_MARK)
    return line


def with_typed_marks(model_line: str, typed_upper: str) -> str:
    """A generated line (``model_form``, as long as ``model_form(typed_upper)``) with the
    ``——`` / ``……`` of the typed 上联 put back at the mirrored places."""
    if not any(mark in typed_upper for mark in LONG_MARKS):
        return model_line
    if len(model_line) != len(model_form(typed_upper)):
        raise ValueError(f"{model_line!r} does not mirror the 上联 {typed_upper!r}")
    out: list[str] = []
    i = 0
    for ch in model_line:
        mark = typed_upper[i : i + 2]
        if mark in LONG_MARKS:
            out.append(mark)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


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
    """``validate_upper`` rule by rule: the normalised line, or the first problem named.

    The length counts the line as typed (a ``——`` is two characters); the other rules see
    each ``——`` / ``……`` as the one clause mark it is (``model_form``)."""
    line = normalize(raw)
    if not line:
        raise InvalidInput(f"{field} is empty", field)
    if len(line) > MAX_LINE_CHARS:
        raise InvalidInput(
            f"{field} is too long: {len(line)} characters, at most {MAX_LINE_CHARS}", field
        )
    marks = model_form(line)
    bad = [ch for ch in marks if not is_han(ch) and ch not in CLAUSE_PUNCT]
    if bad:
        shown = "".join(dict.fromkeys(bad))[:8]
        raise InvalidInput(
            f"{field} must be Chinese characters (with ，、；：！？。 —— …… between clauses); "
            f"found {shown!r}",
            field,
        )
    if not is_han(marks[0]) or not is_han(marks[-1]):
        raise InvalidInput(f"{field} must begin and end with a Chinese character", field)
    for a, b in zip(marks, marks[1:], strict=False):
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
