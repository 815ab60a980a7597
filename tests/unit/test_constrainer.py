"""The batched rule masks (``Constrainer.apply``) and prefill length grouping, directly."""

from __future__ import annotations

import pytest
import torch

from chunlian.data.blocklist import Blocklist
from chunlian.engine.prefill import PREFILL_FIXED_TOKENS, prefill_chunks
from chunlian.engine.request import SeqSpec
from chunlian.model.decoding import Constrainer, LineState
from chunlian.model.tokenizer import Tokenizer
from chunlian.text import tone_class

PING = "东西南光"
ZE = "雨雪马道酒树"
UPPER = "天地"  # 天 ping, 地 ze


def _constrainer() -> Constrainer:
    tok = Tokenizer.build([PING + ZE + UPPER], min_count=1)
    return Constrainer(tok, Blocklist(set()), torch.device("cpu"))


def _allowed(con: Constrainer, scores: torch.Tensor, row: int) -> set[str]:
    return {con.tok.itos[i] for i in torch.isfinite(scores[row]).nonzero()[:, 0].tolist()}


def test_each_row_gets_its_own_bans_and_tone_rule() -> None:
    assert tone_class("地") == "ze" and all(tone_class(c) == "ping" for c in PING)
    con = _constrainer()
    states = [
        LineState("traditional", UPPER, 2, lower="雨"),  # last position, upper ends 仄: 平 only
        LineState("business", UPPER, 2),  # first position: no Han of the 上联, free tone
        LineState("traditional", "天，", 2, lower="雪"),  # punctuation is forced
    ]
    logits = torch.zeros(3, len(con.tok))
    out = con.apply(logits, states, tone_bias=2.0)
    assert out.forced == [None, None, "，"]
    assert _allowed(con, out.scores, 0) == set(PING)
    assert _allowed(con, out.scores, 1) == set(PING + ZE)
    assert out.top_value.tolist() == out.scores.max(dim=1).values.tolist()
    assert out.top_id.tolist() == out.scores.argmax(dim=1).tolist()


def test_a_hard_tone_that_leaves_no_choice_yields_then_every_ban_yields() -> None:
    con = _constrainer()
    # last position, 上联 ends 仄, every 平 character is used: only 树 (仄) is left, and
    # the 平 ending yields rather than leave no choice
    hard = LineState("traditional", PING + "天地", 6, lower="雨雪马道酒")
    # composing, every Han character already used: the fallback is any Han character
    every = LineState("traditional", PING + ZE + UPPER, 20, phase="upper")
    free = LineState("traditional", UPPER, 2)
    out = con.apply(torch.zeros(3, len(con.tok)), [hard, every, free], tone_bias=0.0)
    assert _allowed(con, out.scores, 0) == {"树"}
    assert _allowed(con, out.scores, 1) == set(PING + ZE + UPPER)
    assert _allowed(con, out.scores, 2) == set(PING + ZE)  # untouched by its neighbours
    assert out.top_id.tolist()[0] == con.tok.stoi["树"]
    assert torch.isfinite(out.top_value).all()


def _spec(i: int, length: int) -> SeqSpec:
    return SeqSpec(seq_id=i, style="traditional", upper="春" * length, upper_len=length)


def _tokens(s: SeqSpec) -> int:
    return len(s.prompt_chars)


@pytest.mark.parametrize("lengths", [[7] * 20, [5, 30] * 10, [5, 6, 7, 8, 20, 21, 30, 31], [9]])
def test_prefill_chunks_keep_every_spec_once_and_never_cost_more(lengths: list[int]) -> None:
    specs = [_spec(i, n) for i, n in enumerate(lengths)]
    chunks = prefill_chunks(specs, _tokens)
    assert sorted(s.seq_id for c in chunks for s in c) == list(range(len(specs)))

    def cost(cs: list[list[SeqSpec]]) -> int:
        return sum(PREFILL_FIXED_TOKENS + max(map(_tokens, c)) * len(c) for c in cs)

    assert cost(chunks) <= cost([specs])
    if len(set(lengths)) == 1:
        assert len(chunks) == 1
    if lengths == [5, 30] * 10:  # 10 short lines padded to 30 would waste 250 tokens
        assert [sorted({_tokens(s) for s in c}) for c in chunks] == [[5], [30]]
