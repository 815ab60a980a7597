"""Traditional-script requests: generated on their simplified form, answered in traditional
characters, what the user typed kept as typed, and the couplet rules still holding."""

from __future__ import annotations

import pytest

from chunlian.offline import OfflineGenerator
from chunlian.script import converted_couplet, is_traditional, rules_hold, simplified, traditional
from chunlian.types import CoupletRequest, DecodeParams
from chunlian.validation import validate_heads


def test_conversion_both_ways() -> None:
    assert simplified("爆竹聲聲辭舊歲") == "爆竹声声辞旧岁"
    assert is_traditional("辭舊歲") and not is_traditional("辞旧岁") and not is_traditional(None)
    assert not is_traditional("春回大地")  # the same in both scripts
    assert traditional("梅花朵朵报新春") == "梅花朵朵報新春"
    assert traditional("头发") == "頭髮" and traditional("发财") == "發財"  # by context
    assert traditional("发财", keep={0: "髮"}) == "髮財"  # a pinned position wins


def test_a_repeat_stays_a_repeat_and_a_broken_rule_falls_back() -> None:
    # one form for every occurrence of a simplified character (zhconv alone: 頭髮發財)
    assert traditional("头发发财") == "頭髮髮財"
    assert rules_hold("爆竹聲聲辭舊歲", "梅花朵朵報新春", ping_ending=True)
    assert not rules_hold("爆竹聲聲辭舊歲", "梅花朵朵報新歲", ping_ending=False)  # shares 歲
    assert not rules_hold("春風，得意", "瑞雪迎，祥", ping_ending=False)  # punctuation moved
    # a converted lower line that would break a rule against the typed upper is answered in
    # the simplified form the rules were enforced on
    upper, lower = converted_couplet("头发长", "干杯酒", {}, {}, typed_upper="頭髮乾")
    assert (upper, lower) == ("頭髮乾", "干杯酒")  # 乾 typed, 乾杯 converted: would share it


def test_heads_that_are_one_character_in_simplified_head_both_lines() -> None:
    # one character typed in two scripts is a repeated character: it heads both lines
    assert validate_heads("後后") == "後后"
    assert validate_heads("陳明") == "陳明"
    assert validate_heads("陳秀英") == "秀英"


@pytest.fixture(scope="module")
def gen() -> OfflineGenerator:
    return OfflineGenerator.load(capacity=16)


def test_a_traditional_request_is_answered_in_traditional(gen: OfflineGenerator) -> None:
    typed = ["爆竹聲聲辭舊歲", "一帆風順年年好", "春風得意，萬象更新"]
    trad = gen.generate([CoupletRequest(upper=u) for u in typed])
    simp = gen.generate([CoupletRequest(upper=simplified(u)) for u in typed])
    for u, t, s in zip(typed, trad, simp, strict=True):
        assert not isinstance(t, Exception) and not isinstance(s, Exception)
        assert t.best.upper == u  # as typed
        assert simplified(t.best.lower) == s.best.lower  # the same answer, converted
        assert simplified(t.best.hengpi) == s.best.hengpi
        assert is_traditional(t.best.lower) or t.best.lower == s.best.lower
        assert rules_hold(u, t.best.lower, ping_ending=False)
    # before: 爆竹聲聲辭舊歲 -> 梅花香香满庭除 (the model saw unknown characters), in simplified
    assert trad[0].best.lower == "梅花朵朵迎新春"


def test_a_traditional_name_keeps_its_characters(gen: OfflineGenerator) -> None:
    res = gen.generate([CoupletRequest(heads="陳明", length=7),
                        CoupletRequest(keyword="龍騰", length=7),
                        CoupletRequest(upper="一帆風順年年好", params=DecodeParams(n=3, seed=5))])
    heads, keyword, sampled = res
    assert not isinstance(heads, Exception) and not isinstance(keyword, Exception)
    assert heads.best.upper[0] == "陳" and heads.best.lower[0] == "明"
    assert keyword.best.upper.startswith("龍騰")
    assert not isinstance(sampled, Exception) and len(sampled.candidates) == 3
    assert all(c.upper == "一帆風順年年好" for c in sampled.candidates)


def test_characters_simplified_text_also_writes_do_not_make_a_request_traditional() -> None:
    assert not is_traditional("乾宇") and not is_traditional("於")  # a name, a surname
    assert is_traditional("乾陳")  # 陳 is traditional
