"""The LM head on oneDNN (``model.onednn``): a row's logits do not depend on its batch (also
where large batches go to PyTorch's kernel, as on Intel CPUs), they are PyTorch's within
rounding, loading fp32 on a CPU chooses it (and nothing else does), and the shipped model's
answers are the ones PyTorch's kernel gives."""

from __future__ import annotations

import pytest
import torch

from chunlian.engine.request import SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.model import onednn
from chunlian.model.checkpoint import load_weights
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from tests.unit.runner_util import run_all

pytestmark = pytest.mark.skipif(not onednn.onednn_supported(), reason="this torch build has no oneDNN")

UPPERS = ["春回大地", "瑞雪兆丰年", "春风送暖入屠苏", "一帆风顺年年好", "和顺一门有百福", "天增岁月人增寿",
          "爆竹声中辞旧岁，梅花香里迎新春", "红梅含苞傲冬雪", "江山如画", "门迎百福福星照",
          "国泰民安家家乐，人寿年丰户户春", "书山有路勤为径", "绿柳迎风舞", "万象更新福满门",
          "生意兴隆通四海", "财源茂盛达三江", "岁岁平安福寿长", "一元复始"]


def test_a_row_gets_the_same_logits_in_any_batch_and_close_to_pytorch() -> None:
    """Row counts under the bucket (own kernels) and over it (padded to 16) alike."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(7703, 192, generator=g) * 0.05
    head = onednn.OnednnHead(weight)
    x = torch.randn(130, 192, generator=g)
    with torch.inference_mode():
        full = head(x)
        assert full.shape == (130, 7703)
        for n in (1, 3, 15, 16, 17, 40, 128):
            assert torch.equal(head(x[:n]), full[:n]), n
        assert torch.equal(head(x[5:6]), full[5:6])
        reference = torch.nn.functional.linear(x, weight)
    assert torch.allclose(full, reference, rtol=1e-5, atol=1e-5)


def test_handing_large_batches_to_pytorch_keeps_every_row_batch_invariant() -> None:
    """The Intel layout: oneDNN under ``pytorch_from_rows`` rows, ``F.linear`` from it on. On an
    Intel CPU, where loading uses it, a row's logits must not change when its batch crosses
    the switch (16 rows: oneDNN; 130: PyTorch's kernel), at one row included; elsewhere the
    two kernels need only agree within rounding (nothing there switches)."""
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(7703, 192, generator=g) * 0.05
    head = onednn.OnednnHead(weight, pytorch_from_rows=64)
    x = torch.randn(130, 192, generator=g)
    intel = onednn.cpu_vendor() == "GenuineIntel"
    with torch.inference_mode():
        full = head(x)
        assert torch.equal(full, torch.nn.functional.linear(x, weight))  # 130 rows: PyTorch's kernel
        for n in (1, 2, 4, 15, 16, 40, 63, 64, 65, 128):
            part = head(x[:n])
            assert torch.equal(part, full[:n]) if intel else torch.allclose(part, full[:n], rtol=1e-5, atol=1e-5), n


def test_cpu_vendor_and_the_switch_per_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    assert onednn.cpu_vendor("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n") == "GenuineIntel"
    assert onednn.cpu_vendor("vendor_id : AuthenticAMD") == "AuthenticAMD"
    assert onednn.cpu_vendor("processor : 0\nBogoMIPS : 50.00\n") == ""  # e.g. an ARM CPU
    for vendor, switch in (("GenuineIntel", onednn.PYTORCH_FROM_ROWS), ("AuthenticAMD", None), ("", None)):
        monkeypatch.setattr(onednn, "cpu_vendor", lambda v=vendor: v)
        model = CoupletTransformer(ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32))
        onednn.use_onednn_head(model)
        assert isinstance(model.lm_head, onednn.OnednnHead) and model.lm_head.pytorch_from_rows == switch


def test_load_weights_puts_it_on_fp32_cpu_models_only_and_keeps_the_state_dict() -> None:
    plain = CoupletTransformer(ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32))
    keys = set(plain.state_dict())
    onednn.use_onednn_head(plain)
    head = plain.lm_head
    onednn.use_onednn_head(plain)  # idempotent
    assert isinstance(head, onednn.OnednnHead) and plain.lm_head is head
    assert set(plain.state_dict()) == keys
    assert isinstance(load_weights(None, "cpu").model.lm_head, onednn.OnednnHead)


def test_shipped_model_answers_are_pytorch_kernels_answers() -> None:
    """On an AVX2 AMD EPYC host all 2,000 validation answers were the same
    (``benchmarks/head_kernel.py``); the sums may differ in order on another CPU, so this
    allows one near-tie among these lines."""
    torch.set_num_threads(1)
    fast = load_weights(None, "cpu")
    slow = load_weights(None, "cpu")
    slow.model.lm_head = None

    def run(lm: object, capacity: int) -> dict[str, str]:
        batch = [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u)) for i, u in enumerate(UPPERS)]
        out = run_all(ModelRunner(lm, capacity), batch)  # type: ignore[arg-type]
        return {UPPERS[o.seq_id]: o.lower for o in out.values()}

    batched, alone, before = run(fast, 16), run(fast, 1), run(slow, 16)
    # the head is batch-invariant; PyTorch's own kernels for the blocks sum one row
    # (matrix-vector) in another order than many, so a near-tie may still flip
    assert sum(batched[u] == alone[u] for u in UPPERS) >= len(UPPERS) - 1
    assert sum(batched[u] == before[u] for u in UPPERS) >= len(UPPERS) - 1
