"""int8 matrix products (``model.int8``): choosing them, fixed activation scales, exact
batch invariance, the unchanged state dict, and the shipped model's answers under them."""

from __future__ import annotations

import pytest
import torch

from chunlian.cache.keys import cache_key
from chunlian.engine.request import SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.errors import ConfigError
from chunlian.model import int8, lowp
from chunlian.model.checkpoint import load_weights
from chunlian.model.tokenizer import Tokenizer
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from chunlian.offline import couplet_request

needs_fbgemm = pytest.mark.skipif(not int8.int8_supported(), reason="no fbgemm in this torch build")

UPPERS = ["春回大地", "瑞雪兆丰年", "春风送暖入屠苏", "一帆风顺年年好", "和顺一门有百福", "天增岁月人增寿",
          "爆竹声中辞旧岁，梅花香里迎新春", "红梅含苞傲冬雪", "江山如画", "门迎百福福星照",
          "国泰民安家家乐，人寿年丰户户春", "书山有路勤为径", "绿柳迎风舞", "万象更新福满门"]


def test_int8_needs_a_cpu() -> None:
    with pytest.raises(ConfigError, match="int8.*cuda"):
        lowp.resolve_matmul("int8", "cuda")
    with pytest.raises(ConfigError, match="auto, float32, bfloat16, int8, float16.*'int4'"):
        lowp.resolve_matmul("int4", "cpu")
    if int8.int8_supported():
        assert lowp.resolve_matmul("int8", "cpu") == "int8"


@pytest.mark.parametrize(("lo", "hi"), [(-3.0, 5.0), (0.0, 2.0), (-0.5, 0.0), (0.0, 0.0), (1.0, 4.0)])
def test_act_range_covers_its_inputs_and_keeps_zero_exact(lo: float, hi: float) -> None:
    scale, zp = int8.ActRange(lo, hi).qparams()
    assert scale > 0 and 0 <= zp <= int8.QUANT_LEVELS
    low, high = (0 - zp) * scale, (int8.QUANT_LEVELS - zp) * scale  # what uint8 can hold
    assert low <= min(lo, 0.0) + 1e-9 and high >= max(hi, 0.0) - 1e-9


@needs_fbgemm
def test_int8_linear_is_close_to_fp32_and_exact_across_batches() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 48, generator=g) * 0.05, torch.randn(96, generator=g) * 0.1
    x = torch.randn(40, 48, generator=g)
    layer = int8.Int8Linear(w, b, int8.ActRange(float(x.min()), float(x.max())))
    with torch.inference_mode():
        got = layer(x)
        want = torch.nn.functional.linear(x, w, b)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(40)])
        other = layer(torch.cat([x[:7], torch.randn(9, 48, generator=g) * 3]))[:7]  # other companions
    assert got.dtype == torch.float32 and got.shape == (40, 96)
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()
    assert torch.equal(alone, got)  # integer sums: the same whatever the batch
    assert torch.equal(other, got[:7])
    assert layer.weight is w and layer.bias is b  # the fp32 parameters stay


@needs_fbgemm
def test_swapping_keeps_the_state_dict_and_refuses_a_second_time() -> None:
    tok = Tokenizer.build(["春回大地", "福满人间"], min_count=1)
    model = CoupletTransformer(ModelConfig(vocab_size=len(tok), n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    keys = set(model.state_dict())
    ranges = int8.use_int8_matmuls(model, tok, ["春回大地", "福满人间", "春福"])
    assert set(model.state_dict()) == keys
    assert set(ranges) == {"lm_head"} | {f"blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv", "attn.proj", "fc", "out")}
    assert all(r.lo <= r.hi for r in ranges.values())
    assert isinstance(model.blocks[0].attn.qkv, int8.Int8Linear)  # type: ignore[union-attr]
    assert isinstance(model.lm_head, int8.Int8Linear)
    with pytest.raises(ValueError, match="int8 already"):
        int8.use_int8_matmuls(model, tok, ["春回大地"])
    idx = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        logits = model(idx, torch.arange(4)[None], torch.zeros_like(idx))
    assert logits.shape == (1, 4, len(tok)) and bool(torch.isfinite(logits).all())


@needs_fbgemm
def test_shipped_model_under_int8_answers_alike_alone_and_batched() -> None:
    """Batch invariance is exact (fixed scales, integer sums), every rule still holds,
    calibration is deterministic, and most answers match fp32's."""
    torch.set_num_threads(1)
    loaded = load_weights(None, "cpu", "int8")
    assert loaded.matmul == "int8"

    def run(capacity: int, lm: object = loaded) -> dict[str, str]:
        batch = [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u)) for i, u in enumerate(UPPERS)]
        out = ModelRunner(lm, capacity).run_all(batch)  # type: ignore[arg-type]
        return {UPPERS[o.seq_id]: o.lower for o in out.values()}

    batched, alone = run(16), run(1)
    assert batched == alone
    for u, lower in batched.items():
        assert len(lower) == len(u) and not (set(lower) & set(u.replace("，", "")))
    again = load_weights(None, "cpu", "int8")
    head, head2 = loaded.model.lm_head, again.model.lm_head
    assert isinstance(head, int8.Int8Linear) and isinstance(head2, int8.Int8Linear)
    assert (head.x_scale, head.x_zero_point) == (head2.x_scale, head2.x_zero_point)
    fp32_loaded = load_weights(None, "cpu", "float32")
    fp32 = run(16, fp32_loaded)
    assert sum(batched[u] == fp32[u] for u in UPPERS) >= len(UPPERS) // 2
    # int8 answers differ from fp32's on some lines: the tag (part of every cache key)
    # tells them apart, so a shared Redis never serves one precision's answer for the other
    assert loaded.tag == fp32_loaded.tag + "+int8"
    req = couplet_request(UPPERS[0])
    assert cache_key(loaded.tag, req) != cache_key(fp32_loaded.tag, req)
