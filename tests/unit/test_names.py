"""Names in a 藏头 couplet: the convention for which characters head the lines, the bans
after a name's head (by construction, in every decoding path), repeated characters, and the
search of a composed 上联 (``engine.composed``) on the shipped weights."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chunlian.data.blocklist import default_blocklist
from chunlian.engine.composed import UPPER_SEARCH
from chunlian.model.decoding import LineState, named_list
from chunlian.model.zodiac import with_zodiac
from chunlian.names import (
    FESTIVE_BANNED_CHARS,
    HEAD_NEGATIVE,
    NEAR_HEAD_NEGATIVE,
    NOT_A_PERSON,
    allowed_after_head,
    banned_after_head,
    line_heads,
)
from chunlian.offline import OfflineGenerator
from chunlian.rules import no_shared_char
from chunlian.script import is_traditional
from chunlian.types import BeamParams, CoupletRequest, DecodeParams


@pytest.mark.parametrize(("name", "heads"), [
    ("明", "明"), ("李明", "李明"), ("丹丹", "丹丹"), ("王秀英", "秀英"), ("王丹丹", "丹丹"),
    ("欧阳修", "修"), ("司马光", "光"), ("欧阳娜娜", "娜娜"), ("张李小明", "小明"),
])
def test_the_given_name_of_a_full_name_heads_the_lines(name: str, heads: str) -> None:
    assert line_heads(name) == heads


def test_a_heads_bans_hold_its_negative_words_and_the_common_ones() -> None:
    assert {"言", "说"} <= banned_after_head("胡") and "死" in banned_after_head("胡")
    assert banned_after_head("李") == NEAR_HEAD_NEGATIVE
    assert all(len(v) >= 1 for v in HEAD_NEGATIVE.values())


def test_the_line_state_bans_them_only_right_after_a_names_head() -> None:
    bl = default_blocklist()
    upper = LineState("traditional", "胡", 7, phase="upper", upper_forced={0: "胡"}, named=True)
    _, banned, _, _ = upper.next_rule(bl)
    assert {"言", "说", "死", "病"} <= banned
    keyword = LineState("traditional", "胡", 7, phase="upper", upper_forced={0: "胡"})  # a keyword
    assert "言" not in keyword.next_rule(bl)[1]
    lower = LineState("traditional", "胡马扬蹄辞旧岁", 7, lower_forced={0: "军"}, named=True)
    assert lower.next_rule(bl)[0] == "军"
    lower.push("军")
    assert {"死", "病", "穷"} <= lower.next_rule(bl)[1]
    lower.push("旗")
    assert "穷" not in lower.next_rule(bl)[1]  # only right after the head (死 is never festive)


def test_a_heads_next_character_is_one_the_corpus_writes_after_it() -> None:
    na = allowed_after_head("娜")
    assert na is not None and "郎" not in na and "妇" not in na and "多" in na
    assert "珑" in (allowed_after_head("玲") or ()) and "水" not in (allowed_after_head("玲") or ())
    assert allowed_after_head("a") is None  # a head the table does not cover is free
    lower = LineState("traditional", "张灯结彩迎春到", 7, lower_forced={0: "娜"}, named=True)
    assert lower.allowed_next() is None  # the head itself is forced
    lower.push("娜")
    assert lower.allowed_next() == na
    lower.push("多")
    assert lower.allowed_next() is None
    assert LineState("traditional", "张灯结彩迎春到", 7, lower_forced={0: "娜"}).allowed_next() is None


def test_a_names_lines_keep_a_festive_register_and_the_surname_names_no_one() -> None:
    bl = with_zodiac(default_blocklist(), 2027)
    upper = LineState("traditional", "王", 7, phase="upper", upper_forced={0: "王"}, named=True)
    banned = upper.next_rule(bl)[1]
    assert banned >= FESTIVE_BANNED_CHARS | NOT_A_PERSON  # 王子, 王者: someone else
    upper = LineState("traditional", "王子风", 7, phase="upper", upper_forced={0: "王"}, named=True)
    assert "流" in upper.next_rule(bl)[1] and "恨" in upper.next_rule(bl)[1]
    lower = LineState("traditional", "张灯结彩迎春到", 7, lower="伟人气概万年", lower_forced={0: "伟"}, named=True)
    assert {"愁", "悲", "血"} <= lower.next_rule(bl)[1]
    lower = LineState("traditional", "金羊送福到万家", 7, lower="骏马迎", lower_forced={0: "骏"}, named=True)
    assert "春" in lower.next_rule(bl)[1]  # 马迎春: the horse greeting the Goat's year
    typed = LineState("traditional", "金羊送福到万家", 7, lower="骏马迎")  # a typed 上联's 下联
    assert "春" not in typed.next_rule(bl)[1] and "愁" not in typed.next_rule(bl)[1]
    keyword = LineState("traditional", "王", 7, phase="upper", upper_forced={0: "王"})
    assert "子" not in keyword.next_rule(bl)[1]
    named = named_list(bl)
    assert all(named.find(t) for t in ("刘伶", "王子风流千古恨", "玉兔呈祥", "马岁", "大圣迎春"))
    assert named.find("马去羊来辞旧岁") is None and named.find("三羊开泰") is None


def test_a_repeated_head_opens_both_lines_and_nothing_else_is_shared() -> None:
    state = LineState("traditional", "丹心向党迎新岁", 7, lower_forced={0: "丹"}, named=True)
    forced, _, _, _ = state.next_rule(default_blocklist())
    assert forced == "丹"
    state.push("丹")
    assert "丹" in state.next_rule(default_blocklist())[1]  # no second 丹 in the 下联


@pytest.fixture(scope="module")
def gen() -> OfflineGenerator:
    return OfflineGenerator.load(capacity=16)


@pytest.fixture(scope="module")
def searching() -> OfflineGenerator:
    return OfflineGenerator.load(capacity=16, beam_width=8)


NAMES = ["胡军", "胡", "李娜", "朱婷", "丹丹", "秀英", "静", "超", "可欣", "叶青"]


def test_no_answer_puts_a_banned_character_after_a_names_head(gen: OfflineGenerator, searching: OfflineGenerator) -> None:
    reqs = [CoupletRequest(heads=h, length=n, style=s) for h in NAMES for n, s in ((5, "family"), (7, "traditional"))]
    reqs += [CoupletRequest(heads=h, params=DecodeParams(n=4, seed=3)) for h in NAMES[:4]]
    for g, quality in ((gen, "fast"), (searching, "best")):
        asked = [replace(r, quality="best") if quality == "best" and r.params.seed is None else r for r in reqs]
        for req, res in zip(reqs, g.generate(asked), strict=True):
            assert not isinstance(res, Exception), res
            for c in res.candidates or (res.best,):
                assert c.upper[0] == req.heads[0] and c.upper[1] not in banned_after_head(req.heads[0]), c
                if len(req.heads) == 2:
                    assert c.lower[0] == req.heads[1] and c.lower[1] not in banned_after_head(req.heads[1]), c
                    shared = {ch for ch in c.upper if ch in c.lower}
                    assert shared <= {req.heads[0]} and (shared == set()) == (req.heads[0] != req.heads[1]), c
                else:
                    assert no_shared_char(c.upper, c.lower), c
                assert default_blocklist().find(c.upper + c.lower) is None
                festive = named_list(default_blocklist())
                assert festive.find(c.upper) is None and festive.find(c.lower) is None, c
                assert FESTIVE_BANNED_CHARS.isdisjoint(c.upper + c.lower) and c.upper[1] not in NOT_A_PERSON, c
                for line, head in zip((c.upper, c.lower), req.heads, strict=False):
                    assert line[1] in (allowed_after_head(head) or line[1]), c


def test_the_composed_search_writes_whole_couplets_under_the_heads(gen: OfflineGenerator) -> None:
    reqs = [CoupletRequest(heads=h, length=7, params=DecodeParams(beam=UPPER_SEARCH)) for h in ("秀英", "丹丹")]
    reqs.append(CoupletRequest(keyword="新春", length=5, params=DecodeParams(beam=UPPER_SEARCH)))
    outs = gen.run(reqs)
    for req, out in zip(reqs, outs, strict=True):
        assert out.result is not None, out.error
        assert len(out.beams) == UPPER_SEARCH.width
        assert len({(h.upper, h.lower) for h in out.beams}) == len(out.beams)
        n = req.length or 7
        for h in out.beams:
            assert len(h.upper) == n and len(h.lower) == n, h
            assert h.upper.startswith(req.heads[0] if req.heads else "新春"), h
            if req.heads:
                assert h.lower[0] == req.heads[-1], h
        assert [h.logprob for h in out.beams] == sorted((h.logprob for h in out.beams), reverse=True)
        assert (out.result.best.upper, out.result.best.lower) == (out.beams[0].upper, out.beams[0].lower)


def test_a_composed_search_one_wide_writes_the_greedy_couplet(gen: OfflineGenerator) -> None:
    # the same rules, the same separator between the lines: a width-1 search is greedy decoding
    for heads in ("秀英", "王伟", "丹丹"):
        greedy = gen.run([CoupletRequest(heads=heads, length=7)])[0].result
        searched = gen.run([CoupletRequest(heads=heads, length=7, params=DecodeParams(beam=BeamParams(width=1)))])[0]
        assert greedy is not None and searched.result is not None
        assert (searched.beams[0].upper, searched.beams[0].lower) == (greedy.best.upper, greedy.best.lower)


def test_a_traditional_name_gets_a_traditional_couplet_in_both_modes(
    gen: OfflineGenerator, searching: OfflineGenerator
) -> None:
    for heads in ("陳麗", "麗麗"):  # a repeated character too: both lines keep it as typed
        req = CoupletRequest(heads=heads, length=7)
        for g, quality in ((gen, "fast"), (searching, "best")):
            (res,) = g.generate([replace(req, quality=quality)])
            assert not isinstance(res, Exception), res
            assert res.best.upper[0] == heads[0] and res.best.lower[0] == heads[1], res.best
            assert is_traditional(res.best.upper + res.best.lower + res.best.hengpi), res.best


def test_a_searchs_several_lines_differ_from_each_other_first() -> None:
    from chunlian.engine.request import SeqOutput
    from chunlian.engine.rerank import diverse

    lines = ["英雄伟业国威扬", "英雄伟业世风淳", "英才辈出迎新岁", "英雄伟业国光新", "英姿飒爽展宏图"]
    outs = [SeqOutput(k, "秀水青山春色美", lo, 0.0) for k, lo in enumerate(lines)]
    assert [o.lower for o in diverse(outs, 1)] == ["英雄伟业国威扬"]
    assert [o.lower for o in diverse(outs, 3)] == ["英雄伟业国威扬", "英才辈出迎新岁", "英姿飒爽展宏图"]
    # too few unlike lines: the rest follow in rank order
    assert [o.lower for o in diverse(outs, 5)] == [lines[0], lines[2], lines[4], lines[1], lines[3]]


def test_a_name_whose_second_character_the_model_lacks_is_searched_like_any_other(gen: OfflineGenerator) -> None:
    # 赟 is outside the vocabulary: the rules mask <unk>, and a scored forced head would
    # leave every beam at -inf; it costs nothing instead, as a forced character elsewhere
    out = gen.run([CoupletRequest(heads="王赟", length=7, params=DecodeParams(beam=UPPER_SEARCH)),
                   CoupletRequest(heads="王伟", length=7, params=DecodeParams(beam=UPPER_SEARCH))])
    for o, second in zip(out, "赟伟", strict=True):
        assert o.result is not None, o.error
        assert o.beams and all(h.lower[0] == second and h.upper[0] == "王" for h in o.beams)
