"""fp16-weight products (``model.half``): their agreement across row counts, the unchanged
state dict, choosing them, and the shipped model's answers under them."""

from __future__ import annotations

import pytest
import torch

from chunlian.engine.request import SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.errors import ConfigError
from chunlian.model import half, lowp
from chunlian.model.checkpoint import load_weights
from chunlian.model.transformer import CoupletTransformer, ModelConfig

UPPERS = ["春回大地", "瑞雪兆丰年", "春风送暖入屠苏", "一帆风顺年年好", "和顺一门有百福", "天增岁月人增寿",
          "爆竹声中辞旧岁，梅花香里迎新春", "红梅含苞傲冬雪", "江山如画", "门迎百福福星照",
          "国泰民安家家乐，人寿年丰户户春", "书山有路勤为径", "绿柳迎风舞", "万象更新福满门"]


@pytest.mark.parametrize(("n_in", "n_out"), [(192, 576), (768, 192), (192, 7703)])
def test_a_row_gets_the_same_product_alone_and_in_a_batch(n_in: int, n_out: int) -> None:
    """Under HALF_MAX_ROWS rows the fp16 kernel, from there the fp32 product of the same
    rounded operands: both round to fp16, so they differ by at most one fp16 step, rarely."""
    g = torch.Generator().manual_seed(0)
    layer = half.HalfProduct(torch.randn(n_out, n_in, generator=g) * 0.05, torch.randn(n_out, generator=g) * 0.1)
    x = torch.randn(48, n_in, generator=g)
    with torch.inference_mode():
        batched = layer(x)  # fp32 product path
        alone = torch.cat([layer(x[i : i + 1]) for i in range(48)])  # fp16 kernel, one row
        pairs = torch.cat([layer(x[i : i + 2]) for i in range(0, 48, 2)])  # fp16 kernel, two rows
    assert batched.dtype == alone.dtype == torch.float32 and batched.shape == (48, n_out)
    assert torch.equal(batched, batched.half().float())  # the values are fp16 ones
    step = batched.abs().clamp_min(1e-3) * 2**-10  # one fp16 step (11 significant bits)
    for other in (alone, pairs):
        assert bool(((other - batched).abs() <= step).all())
        assert (other == batched).float().mean().item() > 0.99
    exact = x @ layer.w32.T + layer.b32  # on the unrounded input: off by the input's rounding only
    assert float((batched - exact).abs().max()) < 4e-3 * float(exact.abs().mean())


def test_swapping_layers_keeps_the_state_dict_and_is_idempotent() -> None:
    model = CoupletTransformer(ModelConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    keys = set(model.state_dict())
    half.use_half_matmuls(model)
    half.use_half_matmuls(model)
    assert set(model.state_dict()) == keys
    assert isinstance(model.blocks[0].attn.qkv, half.HalfLinear)  # type: ignore[union-attr]
    assert isinstance(model.lm_head, half.HalfProduct)
    idx = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        logits = model(idx, torch.arange(4)[None], torch.zeros_like(idx))
    assert logits.shape == (1, 4, 50) and bool(torch.isfinite(logits).all())


def test_float16_is_a_cpu_choice() -> None:
    assert lowp.resolve_matmul("float16", "cpu") == "float16"
    with pytest.raises(ConfigError, match="float16.*'cuda'"):
        lowp.resolve_matmul("float16", "cuda")


def test_shipped_model_under_float16_keeps_the_rules_and_its_answers() -> None:
    """Nearly the same answers alone and in a batch, every rule holds, the tag says so,
    and nearly every answer is fp32's (25 of 2,000 validation answers differ)."""
    torch.set_num_threads(1)
    loaded = load_weights(None, "cpu", "float16")
    assert loaded.matmul == "float16" and loaded.tag.endswith("+float16")

    def run(capacity: int, matmul: str = "float16") -> dict[str, str]:
        lm = loaded if matmul == "float16" else load_weights(None, "cpu", "float32")
        batch = [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u)) for i, u in enumerate(UPPERS)]
        out = ModelRunner(lm, capacity).run_all(batch)
        return {UPPERS[o.seq_id]: o.lower for o in out.values()}  # type: ignore[misc]

    batched, alone = run(16), run(1)
    assert sum(batched[u] == alone[u] for u in UPPERS) >= len(UPPERS) - 1
    for u, lower in alone.items():
        assert len(lower) == len(u) and not (set(lower) & set(u.replace("，", "")))
    fp32 = run(16, "float32")
    assert sum(alone[u] == fp32[u] for u in UPPERS) >= len(UPPERS) - 2
