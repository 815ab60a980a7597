"""The 上联 rules of ``chunlian.text``: the one-regex fast path agrees with the rules; the
typed punctuation folds to its full-width form, the dash and the ellipsis (two characters
each) reach the model as one clause mark, a closing 。！？…… does not reach it, and both
come back in the answer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunlian.errors import InvalidInput
from chunlian.text import (
    _VALID_LINE,
    FINAL_MARKS,
    LONG_MARKS,
    MAX_LINE_CHARS,
    _checked_line,
    final_mark,
    model_form,
    normalize,
    validate_upper,
    with_typed_marks,
)

# Han characters, every allowed and some folded punctuation (the dash and ellipsis
# spellings' characters too), whitespace, ASCII, emoji
ALPHABET = "春风得意马蹄疾㐀䶿一鿿，、；：！？。,;:!?.．､｡—-－─―… \t\u3000\u200bab1🎉"


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


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="春风—-－─―….,", max_size=12))
def test_normalize_is_idempotent(raw: str) -> None:
    once = normalize(raw)
    assert normalize(once) == once


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("", "empty"), ("，春", "begin with"), ("春，，风", "two punctuation"),
     ("春a", "must be Chinese"), ("春" * (MAX_LINE_CHARS + 1), "too long"),
     ("——", "begin with"), ("--", "begin with"), ("...", "begin with"), ("。", "begin with"),
     ("!春风", "begin with"), ("--春风", "begin with"), ("……春风", "begin with"),
     ("春风，", "end with a Chinese character or one of 。！？ ……"), ("春风、", "found '、' at the end"),
     ("春风;", "found '；' at the end"), ("春风:", "found '：' at the end"),
     ("春风--", "found '——' at the end"), ("春风。。", "two punctuation"), ("春风!?", "two punctuation"),
     ("春风，。", "two punctuation"), ("春风……。", "two punctuation"), ("春风.....", "two punctuation"),
     ("春——，风", "two punctuation"), ("春----风", "two punctuation"), ("春——……风", "two punctuation"),
     ("春。。。风", "two punctuation"), ("春-风", "found '-'"), ("春－风", "found '－'"),
     ("春" * 16 + "--" + "风" * 15, "too long: 33 characters")],
)
def test_bad_lines_are_named(raw: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        validate_upper(raw)


@pytest.mark.parametrize(
    ("typed", "line"),
    [("春回大地!", "春回大地！"), ("春回大地！", "春回大地！"), ("天增岁月人增寿。", "天增岁月人增寿。"),
     ("天增岁月人增寿.", "天增岁月人增寿。"), ("何处不飞花？", "何处不飞花？"), ("何处不飞花?", "何处不飞花？"),
     ("山药出格九万斤……", "山药出格九万斤……"), ("山药出格九万斤...", "山药出格九万斤……"),
     ("山药出格九万斤…", "山药出格九万斤……"), ("春风——得意, 马蹄疾 !", "春风——得意，马蹄疾！"),
     ("爆竹聲聲辭舊歲！", "爆竹聲聲辭舊歲！")],
)
def test_a_line_may_close_with_one_final_mark(typed: str, line: str) -> None:
    assert validate_upper(typed) == line
    assert final_mark(line) in FINAL_MARKS and line.endswith(final_mark(line))
    assert _VALID_LINE.fullmatch(line)  # the fast path takes the normal form


def test_normalisation_still_applies() -> None:
    assert validate_upper(" 春风, 得意 ") == "春风，得意"


@pytest.mark.parametrize(
    ("typed", "full"),
    [(",", "，"), (";", "；"), (":", "："), ("!", "！"), ("?", "？"), (".", "。"),
     ("．", "。"), ("､", "、"), ("｡", "。"),
     ("——", "——"), ("—", "——"), ("--", "——"), ("－－", "——"), ("──", "——"), ("――", "——"), ("―", "——"),
     ("……", "……"), ("…", "……"), ("...", "……"), ("......", "……"), (" - - ", "——"), (". . .", "……")],
)
def test_every_typed_mark_folds_to_its_full_width_form(typed: str, full: str) -> None:
    assert normalize(f"春风{typed}得意") == f"春风{full}得意"
    assert validate_upper(f"春风{typed}得意") == f"春风{full}得意"


def test_the_ellipsis_folds_before_the_single_period() -> None:
    assert normalize("春...风.得....意") == "春……风。得……。意"
    assert normalize("春风——得意") == "春风——得意" and normalize("春———风") == "春————风"


def test_model_form_reads_each_long_mark_as_one_clause_mark() -> None:
    assert LONG_MARKS == ("——", "……")
    assert model_form("山药出格九万斤——真大") == "山药出格九万斤，真大"
    assert model_form("春……风，得意——马蹄！疾") == "春，风，得意，马蹄！疾"
    assert model_form("春风，得意") == "春风，得意"


def test_model_form_drops_the_final_mark() -> None:
    assert FINAL_MARKS == ("。", "！", "？", "……")
    assert model_form("春回大地！") == "春回大地" and model_form("何处不飞花？") == "何处不飞花"
    assert model_form("天增岁月人增寿。") == "天增岁月人增寿"
    assert model_form("山药出格九万斤……") == "山药出格九万斤"
    assert model_form("春风——得意，马蹄疾……") == "春风，得意，马蹄疾"
    assert model_form("春风。得意！") == "春风。得意"  # only the last mark closes the line
    assert final_mark("春回大地") == "" and final_mark("春回大地？") == "？"


@pytest.mark.parametrize(
    ("typed_upper", "model_lower", "want"),
    [("山药出格九万斤——真大", "芋头入锅三千块，好香", "芋头入锅三千块——好香"),
     ("春……风，得意——马", "秋，雨，失时，牛", "秋……雨，失时——牛"),
     ("春——风……雨", "夏，日，晴", "夏——日……晴"),
     ("春风，得意", "秋雨，失时", "秋雨，失时"),
     ("春回大地！", "福满人间", "福满人间！"),
     ("天增岁月……人增寿。", "春满乾坤，福满门", "春满乾坤……福满门。"),
     ("春——风……", "夏，日", "夏——日……"),
     ("山药出格九万斤……", "芋头入锅三千块", "芋头入锅三千块……")],
)
def test_with_typed_marks_mirrors_the_long_marks(typed_upper: str, model_lower: str, want: str) -> None:
    assert len(model_lower) == len(model_form(typed_upper))
    assert with_typed_marks(model_lower, typed_upper) == want
    assert len(want) == len(typed_upper)
    assert [i for i, ch in enumerate(want) if ch in "—…"] == [i for i, ch in enumerate(typed_upper) if ch in "—…"]
    assert with_typed_marks(model_form(typed_upper), typed_upper) == typed_upper


def test_with_typed_marks_refuses_a_line_that_does_not_mirror() -> None:
    with pytest.raises(ValueError, match="does not mirror"):
        with_typed_marks("秋雨失时", "春——风")


def test_the_length_limit_counts_the_typed_marks() -> None:
    line = "春" * 15 + "——" + "风" * 15
    assert len(line) == MAX_LINE_CHARS and validate_upper(line) == line
    assert validate_upper("春" * 15 + "..." + "风" * 15) == "春" * 15 + "……" + "风" * 15  # 33 typed, 32 after folding
    assert validate_upper("山药出格九万斤--真大") == "山药出格九万斤——真大"
    assert validate_upper("春" * 31 + "!") == "春" * 31 + "！"  # 32 with the final mark
    assert validate_upper("春" * 30 + "...") == "春" * 30 + "……"
    with pytest.raises(InvalidInput, match="too long: 33 characters"):
        validate_upper("春" * 31 + "...")
    with pytest.raises(InvalidInput, match="too long: 33 characters"):
        validate_upper("春" * 32 + "。")
