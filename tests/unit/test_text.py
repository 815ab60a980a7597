"""The 上联 rules of ``chunlian.text``: the one-regex fast path agrees with the rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunlian.errors import InvalidInput
from chunlian.text import _VALID_LINE, MAX_LINE_CHARS, _checked_line, validate_upper

# Han characters, every allowed and some folded punctuation, whitespace, ASCII, emoji
ALPHABET = "春风得意马蹄疾㐀䶿一鿿，、；：！？。,;:!?．､｡ \t\u3000\u200bab1🎉"


def _outcome(raw: str) -> str:
    try:
        return _checked_line(raw, "upper")
    except InvalidInput as e:
        return f"error: {e}"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=MAX_LINE_CHARS + 4))
def test_fast_path_gives_what_the_rules_give(raw: str) -> None:
    expected = _outcome(raw)
    try:
        got = validate_upper(raw)
    except InvalidInput as e:
        got = f"error: {e}"
    assert got == expected
    if len(raw) <= MAX_LINE_CHARS and _VALID_LINE.fullmatch(raw):
        assert got == raw  # what the fast path accepts, the rules accept unchanged


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("", "empty"), ("，春", "begin and end"), ("春，，风", "two punctuation"),
     ("春a", "must be Chinese"), ("春" * (MAX_LINE_CHARS + 1), "too long")],
)
def test_bad_lines_are_named(raw: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        validate_upper(raw)


def test_normalisation_still_applies() -> None:
    assert validate_upper(" 春风, 得意 ") == "春风，得意"
