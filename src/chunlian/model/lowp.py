"""bf16 matrix products for inference on CPUs with AMX (``matmul = "bfloat16"``).

Where the CPU has AMX tiles (Intel Sapphire Rapids and later), oneDNN multiplies bf16
matrices several times faster than fp32: measured here at 128 rows, 31 against 91 us
for the ``[192 -> 576]`` projection and 182 against 1,239 us for the tied LM head over
the 7,703-entry vocabulary. The weights are rounded to bf16 once and pre-packed into
oneDNN's blocked layout (unpacked bf16 weights are re-laid out at every call: 20-30 us
more each). Everything else - embeddings, LayerNorm, attention, the KV cache, the
residual stream - stays fp32, the regime the shipped weights were trained in (bf16
autocast: linear layers in bf16, their outputs added to an fp32 residual).

An AMX product has a fixed cost of about 20 us, so below ``AMX_MIN_ROWS`` rows (a
lone request's decode step) a layer computes the same product in fp32 instead: its
input rounded to bf16 and its weights the bf16-rounded ones, so every product of two
bf16 numbers is exact in fp32 and only the order of the sums (and so, rarely, one bf16
step of the rounded result) differs. That still flips a near-tie now and then: on the
800-line benchmark mix 10-12 answers (1.5%) differ between a request alone and in a
batch, against none in fp32 (``tests/unit/test_lowp.py``). The LM head is faster on AMX
even for one row (49 against 98 us) and always takes it.

Measured end to end (Intel Xeon with AMX, docs/performance.md): +14% sequences/s at 128
rows (``chunlian bench engine``), none at the service's 64 (``bench service``'s engine
peak 557 both ways), -12% for a lone request (the conversions around each product);
validation BLEU-4 2.43 against 2.45 in fp32. Hence fp32 stays the default; ``bfloat16``
(or ``auto``: bf16 where the CPU has AMX) suits large offline batches. On AVX2-only
CPUs bf16 is emulated and slower; on CUDA ``auto`` keeps fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chunlian.errors import ConfigError
from chunlian.model.transformer import CoupletTransformer, block_linears
from chunlian.types import MATMUL_CHOICES

BF16 = torch.bfloat16
# below this many rows an fp32 product of the bf16-rounded operands is cheaper than
# AMX's fixed cost (measured: 2 rows 6-11 vs 18-20 us; 8 rows 14-24 vs 19-20 us)
AMX_MIN_ROWS = 8
# oneDNN builds a kernel ("primitive") for every new row count, 0.7-1 ms each, and keeps
# 1,024 of them; a continuous-batching step's row count takes hundreds of values, so rows
# are padded up to a multiple of this (at most ROW_BUCKET - 1 padding rows per product)
ROW_BUCKET = 16


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU reports AMX bf16 tiles (Linux ``/proc/cpuinfo`` flags)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and " amx_bf16" in line for line in text.splitlines())


def bf16_supported() -> bool:
    """oneDNN can run bf16 products on this CPU (natively or emulated)."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return bool(available and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_matmul(requested: str, device: str) -> str:
    """``auto`` -> ``bfloat16`` on a CPU with AMX, else ``float32``; an explicit
    ``bfloat16`` needs a CPU device with oneDNN bf16 support, ``int8`` fbgemm, ``float16``
    (``model.half``) a CPU device."""
    if requested not in MATMUL_CHOICES:
        raise ConfigError(f"matmul must be one of {', '.join(MATMUL_CHOICES)}, got {requested!r}")
    if requested == "auto":
        return "bfloat16" if device == "cpu" and cpu_has_amx() and bf16_supported() else "float32"
    if requested == "bfloat16" and (device != "cpu" or not bf16_supported()):
        raise ConfigError(f"matmul 'bfloat16' needs a CPU with oneDNN bf16 support, got device {device!r}")
    if requested == "int8":
        from chunlian.model.int8 import int8_supported

        if device != "cpu" or not int8_supported():
            raise ConfigError(f"matmul 'int8' needs a CPU with fbgemm (x86, AVX2), got device {device!r}")
    if requested == "float16" and device != "cpu":
        raise ConfigError(f"matmul 'float16' is a CPU mode (model.half), got device {device!r}")
    return requested


class BF16Linear(nn.Module):
    """``nn.Linear`` for inference with bf16-rounded weights: ``[N, in]`` -> ``[N, out]`` bf16.

    It keeps the original fp32 ``weight`` and ``bias`` as its parameters, so the model's
    ``state_dict`` (what checkpoints hold) is unchanged; the packed and rounded copies it
    computes with are plain attributes."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        w16 = weight.detach().to(BF16).contiguous()  # [out, in]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w16, None)
        self.w32 = w16.float()  # the rounded weights, for products under AMX_MIN_ROWS rows
        self.b16 = None if bias is None else bias.detach().to(BF16)
        self.b32 = None if self.b16 is None else self.b16.float()

    def forward(self, x: Tensor) -> Tensor:
        x16 = x.to(BF16)
        if x.shape[0] < AMX_MIN_ROWS:
            return F.linear(x16.float(), self.w32, self.b32).to(BF16)
        return amx_linear(x16, self.packed, self.b16)


class BF16Head(nn.Module):
    """The tied LM head on AMX at every batch size: ``[N, D]`` -> bf16 logits ``[N, vocab]``."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(BF16).contiguous(), None)

    def forward(self, x: Tensor) -> Tensor:
        return amx_linear(x.to(BF16), self.packed, None)


def amx_linear(x16: Tensor, packed: Tensor, b16: Tensor | None) -> Tensor:
    """``[N, in]`` bf16 -> ``[N, out]`` bf16 through oneDNN, rows padded to ``ROW_BUCKET``."""
    n = x16.shape[0]
    pad = -n % ROW_BUCKET
    if pad:
        x16 = F.pad(x16, (0, 0, 0, pad))
    y: Tensor = torch.ops.mkldnn._linear_pointwise(x16, packed, b16, "none", [], "")
    return y[:n] if pad else y


def use_bf16_matmuls(model: CoupletTransformer) -> None:
    """Swap the model's linear layers and LM head for bf16 ones, in place (inference only:
    they compute with copies made now, which training would not update). Idempotent."""
    for _, owner, attr in block_linears(model):
        layer = getattr(owner, attr)
        if isinstance(layer, nn.Linear):
            setattr(owner, attr, BF16Linear(layer.weight, layer.bias))
    if not isinstance(getattr(model, "lm_head", None), BF16Head):
        model.lm_head = BF16Head(model.tok_emb.weight)
