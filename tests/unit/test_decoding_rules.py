"""Every couplet rule of the decoder holds for random upper lines, even with a random model.

The model is tiny and randomly initialised, so nothing but the rule masks keeps its output
legal: a rule that is not enforced shows up as a counterexample quickly.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunlian.data.blocklist import Blocklist
from chunlian.engine.request import SeqOutput, expand
from chunlian.engine.runner import ModelRunner
from chunlian.model.checkpoint import LoadedModel
from chunlian.model.decoding import LineState, checked_positions, lookahead_banned
from chunlian.model.tokenizer import Tokenizer
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from chunlian.text import CLAUSE_PUNCT, is_han, tone_class
from chunlian.types import CoupletRequest, DecodeParams
from tests.unit.runner_util import run_all

torch.set_num_threads(1)

# Upper lines draw from 16 characters, both tones. The rest of the vocabulary holds more
# 平 characters (24) than a 下联 can use up (at most 16 distinct), so a 平 ending is always
# available, and the blocklist is built from 仄 characters only, so it never takes one away.
UPPER_CHARS = "天地春秋山水风月花鸟人家年岁福寿"
PING_CHARS = "东西南光明清中金银红开来迎庭门城堂歌声华香篇诗"
ZE_CHARS = "雨雪马道路岸燕柳树梦酒去到好美旧"
BLOCK_TERMS = {"雨雪", "马道", "道马", "岸柳树", "梦酒", "好好", "去去", "旧"}
PUNCT = sorted(CLAUSE_PUNCT)


def _alphabet() -> str:
    return UPPER_CHARS + PING_CHARS + ZE_CHARS


def test_alphabet_is_what_the_tests_assume() -> None:
    assert len(set(_alphabet())) == len(_alphabet())
    assert all(tone_class(c) == "ping" for c in PING_CHARS)
    assert all(tone_class(c) == "ze" for c in ZE_CHARS)
    assert len(PING_CHARS) > len(UPPER_CHARS)
    assert {tone_class(c) for c in UPPER_CHARS} == {"ping", "ze"}


@cache
def _blocklist() -> Blocklist:
    return Blocklist(BLOCK_TERMS)


@cache
def _runner() -> ModelRunner:
    torch.manual_seed(1234)
    tok = Tokenizer.build([_alphabet()], min_count=1)
    model = CoupletTransformer(ModelConfig(len(tok), 2, 2, 32, 64))
    return ModelRunner(LoadedModel(model, tok, "t", "0"), capacity=8, blocklist=_blocklist())


def _generate(req: CoupletRequest) -> list[SeqOutput]:
    specs = expand(req, 0)
    out = run_all(_runner(), specs)
    assert sorted(out) == [s.seq_id for s in specs]
    return [out[s.seq_id] for s in specs]


@st.composite
def upper_lines(draw: st.DrawFn) -> str:
    """1..32 characters: clauses of upper-alphabet characters, joined by punctuation."""
    n_clauses = draw(st.integers(1, 4))
    clauses = [
        draw(st.text(alphabet=UPPER_CHARS, min_size=1, max_size=10)) for _ in range(n_clauses)
    ]
    line = clauses[0]
    for c in clauses[1:]:
        line += draw(st.sampled_from(PUNCT)) + c
    return line[:32].rstrip("".join(PUNCT))


def _last_han(line: str) -> str:
    return next(c for c in reversed(line) if is_han(c))


def assert_lower_rules(upper: str, lower: str) -> None:
    assert len(lower) == len(upper)
    for a, b in zip(upper, lower, strict=True):
        if is_han(a):
            assert is_han(b), (upper, lower)
        else:
            assert b == a, (upper, lower)  # punctuation mirrored
    n = len(upper)
    for i in range(n):
        for j in range(i + 1, n):
            assert (upper[i] == upper[j]) == (lower[i] == lower[j]), (upper, lower, i, j)
    assert not ({c for c in upper if is_han(c)} & set(lower)), (upper, lower)
    if tone_class(_last_han(upper)) == "ze":
        assert tone_class(lower[-1]) == "ping", (upper, lower)
    assert _blocklist().find(lower) is None, (upper, lower)


RULE_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@RULE_SETTINGS
@given(upper=upper_lines())
def test_greedy_lower_obeys_every_rule(upper: str) -> None:
    (out,) = _generate(CoupletRequest(upper=upper))
    assert out.upper == upper
    assert_lower_rules(upper, out.lower)


@RULE_SETTINGS
@given(upper=upper_lines(), seed=st.integers(0, 2**31 - 1), n=st.integers(1, 3))
def test_sampled_candidates_obey_every_rule_and_repeat_per_seed(upper: str, seed: int, n: int) -> None:
    req = CoupletRequest(upper=upper, params=DecodeParams(n=n, seed=seed, temperature=1.5))
    first = _generate(req)
    assert len(first) == n
    for out in first:
        assert_lower_rules(upper, out.lower)
    again = _generate(req)
    assert [o.lower for o in again] == [o.lower for o in first]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # a head that is itself a blocked character is refused before decoding, not tested here
    heads=st.lists(
        st.sampled_from([c for c in _alphabet() if c not in BLOCK_TERMS]),
        min_size=1, max_size=2, unique=True,
    ),
    length=st.sampled_from([5, 7]),
    style=st.sampled_from(["traditional", "business", "family", "literary"]),
)
def test_compose_with_heads_opens_both_lines(heads: list[str], length: int, style: str) -> None:
    (out,) = _generate(CoupletRequest(heads="".join(heads), length=length, style=style))
    assert len(out.upper) == length
    assert out.upper[0] == heads[0]
    if len(heads) == 2:
        assert out.lower[0] == heads[1]
    assert all(is_han(c) for c in out.upper)
    assert tone_class(out.upper[-1]) == "ze"  # a composed 上联 ends 仄
    assert _blocklist().find(out.upper) is None
    assert_lower_rules(out.upper, out.lower)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keyword=st.text(alphabet=UPPER_CHARS, min_size=1, max_size=4), length=st.sampled_from([5, 7]))
def test_compose_with_keyword_starts_the_upper_line(keyword: str, length: int) -> None:
    (out,) = _generate(CoupletRequest(keyword=keyword, length=length))
    assert out.upper.startswith(keyword)
    assert len(out.upper) == length
    assert_lower_rules(out.upper, out.lower)


def test_greedy_is_deterministic_and_sampling_depends_on_the_seed() -> None:
    upper = "春风山水花鸟月"
    greedy = [_generate(CoupletRequest(upper=upper))[0].lower for _ in range(2)]
    assert greedy[0] == greedy[1]
    lowers = {
        _generate(CoupletRequest(upper=upper, params=DecodeParams(seed=s, temperature=2.0)))[0].lower
        for s in range(8)
    }
    assert len(lowers) > 1  # a random model at temperature 2 does not collapse onto one line


# ---- the blocklist through forced characters ------------------------------------------


def test_a_forced_repeat_cannot_complete_a_blocked_term() -> None:
    # 上联 天地天: 下联[2] is forced to repeat 下联[0]. After 甲, choosing 乙 would force 乙甲.
    state = LineState(style="traditional", upper="天地天", upper_len=3, lower="甲")
    _, banned, _, _ = state.next_rule(Blocklist({"乙甲"}))
    assert "乙" in banned


def test_a_doubled_character_cannot_form_a_blocked_term() -> None:
    # 上联 天天: whatever fills 下联[0] is repeated at 下联[1].
    state = LineState(style="traditional", upper="天天", upper_len=2)
    _, banned, _, _ = state.next_rule(Blocklist({"甲甲"}))
    assert "甲" in banned


@pytest.mark.parametrize(
    ("upper", "lower", "terms", "expect"),
    [
        ("天地春地天", "甲", {"乙甲"}, {"乙"}),  # later 地天 = ?甲
        ("天地，天", "甲", {"乙甲"}, set()),  # punctuation breaks the window
        ("天地春", "甲", {"甲乙丙"}, set()),  # 丙 can still be avoided later
        ("天地春天", "甲乙", {"丙甲"}, {"丙"}),
    ],
)
def test_lookahead_bans_exactly_the_completing_characters(
    upper: str, lower: str, terms: set[str], expect: set[str]
) -> None:
    assert lookahead_banned(upper, lower, {}, Blocklist(terms)) == expect


def test_checked_positions_are_even_positions_and_clause_ends() -> None:
    assert checked_positions("天增岁月人增寿") == (1, 3, 5, 6)
    assert checked_positions("春来，福到门") == (1, 4, 5)
    assert checked_positions("春") == (0,)
