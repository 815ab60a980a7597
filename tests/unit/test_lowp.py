"""bf16 matrix products (``model.lowp``): choosing them, their equivalence across row
counts, the unchanged state dict, and the shipped model's answers under them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chunlian.engine.request import SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.errors import ConfigError
from chunlian.model import lowp
from chunlian.model.checkpoint import load_weights
from chunlian.model.transformer import CoupletTransformer, ModelConfig

needs_bf16 = pytest.mark.skipif(not lowp.bf16_supported(), reason="oneDNN has no bf16 on this CPU")

UPPERS = ["春回大地", "瑞雪兆丰年", "春风送暖入屠苏", "一帆风顺年年好", "和顺一门有百福", "天增岁月人增寿",
          "爆竹声中辞旧岁，梅花香里迎新春", "红梅含苞傲冬雪", "江山如画", "门迎百福福星照",
          "国泰民安家家乐，人寿年丰户户春", "书山有路勤为径", "绿柳迎风舞", "万象更新福满门"]


def test_cpu_flags_decide_auto(tmp_path: Path) -> None:
    with_amx = tmp_path / "amx"
    with_amx.write_text("processor : 0\nflags : fpu avx512f amx_bf16 amx_tile\n")
    without = tmp_path / "plain"
    without.write_text("processor : 0\nflags : fpu avx2 fma\n")
    assert lowp.cpu_has_amx(with_amx)
    assert not lowp.cpu_has_amx(without)
    assert not lowp.cpu_has_amx(tmp_path / "missing")


def test_bad_choices_are_refused_with_what_was_expected() -> None:
    with pytest.raises(ConfigError, match="auto, float32, bfloat16.*'fp8'"):
        lowp.resolve_matmul("fp8", "cpu")
    with pytest.raises(ConfigError, match="cuda"):
        lowp.resolve_matmul("bfloat16", "cuda")
    assert lowp.resolve_matmul("auto", "cuda") == "float32"
    assert lowp.resolve_matmul("float32", "cpu") == "float32"


@needs_bf16
@pytest.mark.parametrize(("n_in", "n_out"), [(192, 576), (768, 192)])
def test_a_row_gets_the_same_product_alone_and_in_a_batch(n_in: int, n_out: int) -> None:
    """Under AMX_MIN_ROWS rows the product is fp32 on the bf16-rounded operands, above it
    AMX; both round to bf16, so they differ by at most one bf16 step in rare elements."""
    g = torch.Generator().manual_seed(0)
    layer = lowp.BF16Linear(torch.randn(n_out, n_in, generator=g) * 0.05, torch.randn(n_out, generator=g) * 0.1)
    x = torch.randn(64, n_in, generator=g)
    with torch.inference_mode():
        batched = layer(x).float()  # AMX
        alone = torch.cat([layer(x[i : i + 1]) for i in range(64)]).float()  # fp32 path
        odd = layer(x[:37]).float()  # padded to a multiple of ROW_BUCKET
    assert batched.dtype == torch.float32 and batched.shape == (64, n_out)
    step = batched.abs().clamp_min(1e-3) * 2**-7  # one bf16 step (8 mantissa bits)
    assert bool(((alone - batched).abs() <= step).all())
    assert (alone == batched).float().mean().item() > 0.99
    assert torch.equal(odd, batched[:37])


@needs_bf16
def test_swapping_layers_keeps_the_state_dict_and_is_idempotent() -> None:
    model = CoupletTransformer(ModelConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    keys = set(model.state_dict())
    lowp.use_bf16_matmuls(model)
    lowp.use_bf16_matmuls(model)
    assert set(model.state_dict()) == keys
    assert isinstance(model.blocks[0].attn.qkv, lowp.BF16Linear)  # type: ignore[union-attr]
    assert isinstance(model.lm_head, lowp.BF16Head)
    idx = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        logits = model(idx, torch.arange(4)[None], torch.zeros_like(idx))
    assert logits.shape == (1, 4, 50) and bool(torch.isfinite(logits.float()).all())


@needs_bf16
def test_shipped_model_under_bf16_keeps_the_rules_and_mostly_its_answers() -> None:
    """The same answers alone and in a batch for nearly every line (AMX and the fp32 path
    agree to a bf16 step), every rule still holds, and most answers match fp32's."""
    torch.set_num_threads(1)
    loaded = load_weights(None, "cpu", "bfloat16")
    assert loaded.matmul == "bfloat16"

    def run(capacity: int, model_matmul: str = "bfloat16") -> dict[str, str]:
        lm = loaded if model_matmul == "bfloat16" else load_weights(None, "cpu", "float32")
        batch = [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u)) for i, u in enumerate(UPPERS)]
        out = ModelRunner(lm, capacity).run_all(batch)
        return {UPPERS[o.seq_id]: o.lower for o in out.values()}  # type: ignore[misc]

    batched, alone = run(16), run(1)
    assert sum(batched[u] == alone[u] for u in UPPERS) >= len(UPPERS) - 1
    for u, lower in batched.items():
        assert len(lower) == len(u) and not (set(lower) & set(u.replace("，", "")))
    fp32 = run(16, "float32")
    assert sum(batched[u] == fp32[u] for u in UPPERS) >= len(UPPERS) // 2
