"""The dash and the ellipsis of a typed 上联 and its closing 。！？……: the model reads each
dash or ellipsis as one "，" and the line without its closing mark, and every answer path
(greedy, sampled candidates, beam search, traditional script) gives the 下联 the typed marks
at the same places, with every couplet rule holding on the typed lines."""

from __future__ import annotations

import pytest

from chunlian.cache import cache_key
from chunlian.engine.request import SeqOutput, expand, model_request
from chunlian.engine.rerank import build_result
from chunlian.offline import OfflineGenerator
from chunlian.rules import last_han
from chunlian.script import is_traditional, rules_hold, simplified, traditional
from chunlian.text import is_han, tone_class, validate_upper
from chunlian.types import Couplet, CoupletRequest, DecodeParams
from tests.unit.test_model_shipped import assert_rules

TYPED = ["山药出格九万斤--真大", "爆竹聲聲辭舊歲……梅花香", "春风得意——马蹄疾，一日看尽长安花",
         "天增岁月...人增寿", "福到农家—喜盈门"]
# closed by a final mark (typed as people type them)
CLOSED = ["春回大地!", "爆竹聲聲辭舊歲！", "天增岁月人增寿。", "何处不飞花？", "山药出格九万斤...",
          "春风得意——马蹄疾?"]


def marks(line: str) -> list[tuple[int, str]]:
    return [(i, ch) for i, ch in enumerate(line) if not is_han(ch)]


def test_the_model_reads_a_long_mark_as_one_clause_mark() -> None:
    req = CoupletRequest(upper=validate_upper("爆竹聲聲辭舊歲……梅花香"), params=DecodeParams(n=2, seed=1))
    assert model_request(req).upper == "爆竹声声辞旧岁，梅花香"
    specs = expand(req, 5)
    assert [(s.seq_id, s.upper, s.upper_len) for s in specs] == [(5, "爆竹声声辞旧岁，梅花香", 11)] + [(6, "爆竹声声辞旧岁，梅花香", 11)]
    plain = CoupletRequest(upper="春回大地")
    assert model_request(plain) is plain


def test_the_model_reads_a_closed_line_without_its_final_mark() -> None:
    req = CoupletRequest(upper=validate_upper("春回大地!"), params=DecodeParams(n=2, seed=1))
    assert req.upper == "春回大地！" and model_request(req).upper == "春回大地"
    assert [(s.upper, s.upper_len) for s in expand(req, 1)] == [("春回大地", 4)] * 2
    trad = CoupletRequest(upper=validate_upper("爆竹聲聲——辭舊歲..."))
    assert model_request(trad).upper == "爆竹声声，辞旧岁"


def test_a_closed_line_is_its_own_request_for_the_cache_and_coalescing() -> None:
    closed, plain = CoupletRequest(upper="春回大地！"), CoupletRequest(upper="春回大地")
    assert closed.identity() != plain.identity()  # the engine coalesces by identity
    assert cache_key("m@1", closed) != cache_key("m@1", plain)
    assert cache_key("m@1", closed) != cache_key("m@1", CoupletRequest(upper="春回大地。"))
    assert cache_key("m@1", closed) == cache_key("m@1", CoupletRequest(upper=validate_upper("春回大地!")))


def test_the_result_gets_the_final_mark_back_for_every_candidate_in_both_scripts() -> None:
    req = CoupletRequest(upper="春回大地！", params=DecodeParams(n=2, seed=3))
    outs = [SeqOutput(0, "春回大地", "福满人间", -1.0), SeqOutput(1, "春回大地", "花开四季", -2.0)]
    res = build_result(req, outs, None, "t@1")
    assert [(c.upper, c.lower) for c in res.candidates] == [("春回大地！", "福满人间！"), ("春回大地！", "花开四季！")]
    assert res.best == res.candidates[0]
    trad = CoupletRequest(upper="爆竹聲聲——辭舊歲……")
    res = build_result(trad, [SeqOutput(0, "爆竹声声，辞旧岁", "梅花点点，迎新春", -1.0)], None, "t@1")
    assert (res.best.upper, res.best.lower) == ("爆竹聲聲——辭舊歲……", "梅花點點——迎新春……")


def test_the_result_gets_the_typed_marks_back_in_both_scripts() -> None:
    simp = CoupletRequest(upper="天增岁月……人增寿")
    res = build_result(simp, [SeqOutput(0, "天增岁月，人增寿", "春满乾坤，福满门", -1.0)], None, "t@1")
    assert (res.best.upper, res.best.lower) == ("天增岁月……人增寿", "春满乾坤……福满门")
    trad = CoupletRequest(upper="爆竹聲聲——辭舊歲")
    res = build_result(trad, [SeqOutput(0, "爆竹声声，辞旧岁", "梅花点点，迎新春", -1.0)], None, "t@1")
    assert (res.best.upper, res.best.lower) == ("爆竹聲聲——辭舊歲", "梅花點點——迎新春")


@pytest.fixture(scope="module")
def greedy() -> OfflineGenerator:
    return OfflineGenerator.load(capacity=16)


def check(typed: str, upper: str, lower: str) -> None:
    line = validate_upper(typed)
    assert upper == line  # as typed, marks in their canonical form
    assert len(lower) == len(line) and marks(lower) == marks(line)
    assert_rules(line, lower)
    assert rules_hold(line, lower, ping_ending=tone_class(last_han(line)) == "ze")


def assert_traditional(c: Couplet) -> None:
    """Answered in traditional characters: the lines and 横批 are in their converted form (a
    line may hold no character that conversion changes, so the 横批 is checked with it)."""
    for text in (c.lower, c.hengpi):
        assert traditional(simplified(text)) == text
    assert is_traditional(c.lower + c.hengpi)


def test_greedy_and_sampled_answers_mirror_the_typed_marks(greedy: OfflineGenerator) -> None:
    reqs = [CoupletRequest(upper=validate_upper(u)) for u in TYPED]
    reqs.append(CoupletRequest(upper=validate_upper(TYPED[0]), params=DecodeParams(n=3, seed=7)))
    res = greedy.generate(reqs)
    for typed, r in zip([*TYPED, TYPED[0]], res, strict=True):
        assert not isinstance(r, Exception)
        for c in r.candidates or (r.best,):
            check(typed, c.upper, c.lower)
    # the 下联 is the one the model writes for the line with "，" in the mark's place
    plain = greedy.generate([CoupletRequest(upper="山药出格九万斤，真大")])[0]
    assert not isinstance(plain, Exception) and not isinstance(res[0], Exception)
    assert res[0].best.lower == plain.best.lower.replace("，", "——")
    trad = res[1]
    assert not isinstance(trad, Exception)
    assert_traditional(trad.best)


def test_greedy_and_sampled_answers_close_with_the_typed_final_mark(greedy: OfflineGenerator) -> None:
    reqs = [CoupletRequest(upper=validate_upper(u)) for u in CLOSED]
    reqs.append(CoupletRequest(upper=validate_upper(CLOSED[0]), params=DecodeParams(n=3, seed=7)))
    res = greedy.generate(reqs)
    for typed, r in zip([*CLOSED, CLOSED[0]], res, strict=True):
        assert not isinstance(r, Exception)
        for c in r.candidates or (r.best,):
            check(typed, c.upper, c.lower)
            assert c.lower[-1] == c.upper[-1] and not is_han(c.lower[-1])
    assert not isinstance(res[-1], Exception) and len(res[-1].candidates) == 3
    # the 下联 is the one the model writes for the line without its final mark
    plain = greedy.generate([CoupletRequest(upper="春回大地")])[0]
    assert not isinstance(plain, Exception) and not isinstance(res[0], Exception)
    assert res[0].best.lower == plain.best.lower + "！"
    trad = res[1]
    assert not isinstance(trad, Exception) and trad.best.lower.endswith("！")
    assert_traditional(trad.best)


def test_beam_search_answers_mirror_the_typed_marks() -> None:
    beam = OfflineGenerator.load(capacity=16, beam_width=4)
    res = beam.generate([CoupletRequest(upper=validate_upper(u)) for u in [*TYPED, *CLOSED]])
    for typed, r in zip([*TYPED, *CLOSED], res, strict=True):
        assert not isinstance(r, Exception)
        check(typed, r.best.upper, r.best.lower)
