"""Text rules shared by the data pipeline, the decoder and the API.

A couplet line is a string of Han characters, optionally split into clauses by Chinese
punctuation; a typed 上联 may also close with one sentence-final mark. Everything here is
pure Python and cheap: it runs on every request.
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

# Marks a 上联 may end with (after its last Han character), as people write 春回大地！. The
# model learned lines that end with a Han character, so it reads the line without it
# (``model_form``) and both answered lines get it back (``with_typed_marks``). Clause marks
# such as "，" do not close a line and stay refused there.
FINAL_MARKS = ("。", "！", "？", ELLIPSIS)
# a line as units: each ——, …… one unit, every other character one
_UNIT = re.compile(f"{DASH}|{ELLIPSIS}|.", re.DOTALL)


_HAN_CLASS = "\u4e00-\u9fff\u3400-\u4dbf"  # the ranges of ``is_han``
# A line that is already normal and passes every rule of ``validate_upper``: Han first, at
# most one punctuation mark (or one ——, ……) between Han characters, Han or one final mark
# last. Checked first because almost every request is such a line; anything else takes the
# rule-by-rule path, which names the problem.
_VALID_LINE = re.compile(
    f"[{_HAN_CLASS}](?:(?:[{''.join(sorted(CLAUSE_PUNCT))}]|{DASH}|{ELLIPSIS})?[{_HAN_CLASS}])*"
    f"(?:{'|'.join(FINAL_MARKS)})?"
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


def final_mark(line: str) -> str:
    """The sentence-final mark that closes ``line`` (one of ``FINAL_MARKS``), or ''."""
    return next((mark for mark in FINAL_MARKS if line.endswith(mark)), "")


def model_form(line: str) -> str:
    """``line`` as the model reads it: without its final mark, each ``——`` / ``……`` one
    clause mark ("，")."""
    line = line[: len(line) - len(final_mark(line))]
    for mark in LONG_MARKS:
        line = line.replace(mark, _MODEL_MARK)
    return line


def with_typed_marks(model_line: str, typed_upper: str) -> str:
    """A generated line (``model_form``, as long as ``model_form(typed_upper)``) with the
    ``——`` / ``……`` of the typed 上联 put back at the mirrored places and its final mark
    at the end."""
    end = final_mark(typed_upper)
    body = typed_upper[: len(typed_upper) - len(end)]
    if not any(mark in body for mark in LONG_MARKS):
        return model_line + end
    if len(model_line) != len(model_form(body)):
        raise ValueError(f"{model_line!r} does not mirror the 上联 {typed_upper!r}")
    out: list[str] = []
    i = 0
    for ch in model_line:
        mark = body[i : i + 2]
        if mark in LONG_MARKS:
            out.append(mark)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out) + end


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
    each ``——`` / ``……`` as the one mark it is."""
    line = normalize(raw)
    if not line:
        raise InvalidInput(f"{field} is empty", field)
    if len(line) > MAX_LINE_CHARS:
        raise InvalidInput(
            f"{field} is too long: {len(line)} characters, at most {MAX_LINE_CHARS}", field
        )
    _check_marks(_UNIT.findall(line), field)
    return line


def _check_marks(units: list[str], field: str) -> None:
    """The punctuation rules over a normalised line's units (``_UNIT``)."""
    han = [len(u) == 1 and is_han(u) for u in units]
    bad = [u for u, h in zip(units, han, strict=True)
           if not h and u not in CLAUSE_PUNCT and u not in LONG_MARKS]
    if bad:
        shown = "".join(dict.fromkeys(bad))[:8]
        raise InvalidInput(
            f"{field} must be Chinese characters (with ，、；：！？。 —— …… between clauses, "
            f"and 。！？ …… at the end); found {shown!r}",
            field,
        )
    if not han[0]:
        raise InvalidInput(f"{field} must begin with a Chinese character", field)
    if any(not a and not b for a, b in zip(han, han[1:], strict=False)):
        raise InvalidInput(f"{field} has two punctuation marks in a row", field)
    if not han[-1] and units[-1] not in FINAL_MARKS:
        raise InvalidInput(
            f"{field} must end with a Chinese character or one of 。！？ …… after it; "
            f"found {units[-1]!r} at the end",
            field,
        )


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
