"""``model.lean.decode_step``: a decode step's logits and cache writes are ``forward_groups``'s,
bit for bit, at any batch, row offset and position; it steps aside where the general path
must run (training, prefill, swapped precisions), and the runner's answers are unchanged."""

from __future__ import annotations

import pytest
import torch

from chunlian.model.checkpoint import load_weights
from chunlian.model.lean import _plain_params, decode_step
from chunlian.model.transformer import CoupletTransformer, GroupInput, KVCache, ModelConfig
from tests.unit.runner_util import run_all


def _decode_input(B: int, row0: int, S: int, seed: int) -> GroupInput:
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(4, S, (B,), generator=g)
    pos[0] = S - 1  # the longest row sets S
    idx = torch.randint(20, 2000, (B, 1), generator=g)
    role = torch.randint(1, 60, (B, 1), generator=g)
    mask = (torch.arange(S)[None, :] <= pos[:, None])[:, None, :]  # [B, 1, S]
    return GroupInput(idx, pos[:, None], role, mask, row0=row0, cache_pos=pos)


@pytest.mark.parametrize("B,row0", [(1, 0), (3, 2), (8, 0), (64, 1)])
def test_logits_and_cache_writes_are_the_general_paths_bit_for_bit(B: int, row0: int) -> None:
    model = load_weights(None, "cpu").model.eval()
    a = KVCache(model.cfg, 70, torch.device("cpu"), torch.float32)
    a.k.normal_(generator=torch.Generator().manual_seed(B))
    a.v.normal_(generator=torch.Generator().manual_seed(B + 1))
    b = KVCache(model.cfg, 70, torch.device("cpu"), torch.float32)
    b.k.copy_(a.k)
    b.v.copy_(a.v)
    gi = _decode_input(B, row0, 30, seed=B)
    with torch.inference_mode():
        want = model.forward_groups([gi], a)
        got = decode_step(model, gi, b)
    assert got.shape == (B, model.cfg.vocab_size)
    assert torch.equal(got, want)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_it_steps_aside_for_training_prefill_and_swapped_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    model = CoupletTransformer(ModelConfig(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32))
    assert _plain_params(model) is not None
    calls: list[int] = []
    general = model.forward_groups
    monkeypatch.setattr(model, "forward_groups", lambda inputs, cache=None: calls.append(1) or general(inputs, cache))
    cache = KVCache(model.cfg, 4, torch.device("cpu"), torch.float32)
    gi = _decode_input(2, 0, 6, seed=0)
    gi.idx.clamp_(max=59)
    with torch.inference_mode():
        decode_step(model.eval(), gi, cache)
        assert calls == []  # the lean path
        model.train()
        decode_step(model, gi, cache)
        model.eval()
        prefill = GroupInput(gi.idx, gi.pos, gi.role, gi.mask)  # no cache_pos: a prefill group
        decode_step(model, prefill, cache)
        model.blocks[1].fc = torch.nn.Sequential(model.blocks[1].fc)  # a precision's swap
        assert _plain_params(model) is None
        decode_step(model, gi, cache)
    assert calls == [1, 1, 1]


def test_the_runner_answers_the_same_on_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole generations, decode steps on the lean path and on ``forward_groups``."""
    from chunlian.engine import runner as runner_mod
    from chunlian.engine.request import SeqSpec
    from chunlian.engine.runner import ModelRunner

    uppers = ["春回大地", "瑞雪兆丰年", "爆竹声中辞旧岁，梅花香里迎新春", "门迎百福福星照", "一元复始"]
    loaded = load_weights(None, "cpu")

    def run() -> dict[str, str]:
        specs = [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u)) for i, u in enumerate(uppers)]
        return {uppers[o.seq_id]: o.lower for o in run_all(ModelRunner(loaded, 3), specs).values()}

    lean = run()
    monkeypatch.setattr(runner_mod, "decode_step", lambda model, gi, cache: model.forward_groups([gi], cache))
    assert run() == lean
