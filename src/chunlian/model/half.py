"""fp16 weights for small batches on memory-bound CPUs (``matmul = "float16"``).

A lone request's decode step multiplies one row by every weight matrix: 16.5 MB of fp32
weights (the 7,703-way LM head alone 5.9 MB) read for a few hundred kFLOPs, so on a CPU
with little memory bandwidth the step is bound by reading weights, not by arithmetic.
Measured on an AVX2-only AMD EPYC host (2 threads, the 25 products of
one step over weights not in cache): 3.5-4.3 ms in fp32, 1.4-1.7 ms with fp16 weights
(PyTorch's fp16 matrix-vector kernel, fp32 sums); at 6 rows and more fp32 is as fast or
faster, and at 128 rows fp16 is 5x slower (no fp16 arithmetic on AVX2).

So under ``HALF_MAX_ROWS`` rows a layer runs the fp16 kernel, and from there on an fp32
product of the *same* operands: its input rounded to fp16, the fp16 weights widened to
fp32, and its output rounded to fp16. A product of two fp16 numbers is exact in fp32 (11
+ 11 significant bits), so the two paths differ only in the order of their sums, and the
rounded outputs in rare elements by one fp16 step: a request's answer is nearly always
the same alone and in a batch (``tests/unit/test_half.py``). The fp16 values are the
shipped weights themselves (they are stored in fp16); what rounding changes is the
activations between layers. The residual stream, LayerNorm, attention, the KV cache and
the rules stay fp32.

End to end on that host (docs/performance.md): a lone request 42 ms
against 58-65 in fp32 (opt-in int8: 44-48); validation BLEU-4 3.263 one request at a time
and 3.288 at 128 rows, against fp32's 3.289; 25 of 2,000 answers differ from fp32's, 11
between one at a time and 128 rows (fp32: none). Large batches are slower than fp32
(the roundings: 4-9% at 128 rows, static batches -22% in one run not interleaved). fp32 stays the default; ``float16`` suits low-traffic deployments on
CPUs like that one, where most steps run a few rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chunlian.model.transformer import CoupletTransformer, block_linears

F16 = torch.float16
# fp16 kernel below this many rows, the fp32 product of the fp16-rounded operands from it
# (measured, 25 products, ms: 1 row 1.4 vs 4.0; 4 rows 3.7 vs 6.5; 6 rows 5.4 vs 5.2;
# 8 rows 7.0 vs 6.0; 128 rows 94 vs 19)
HALF_MAX_ROWS = 5


class HalfProduct(nn.Module):
    """``x @ weight.T + bias`` on fp16-rounded copies: ``[N, in]`` -> ``[N, out]`` fp32
    holding fp16-rounded values. The copies are plain attributes, not parameters, so the
    model's ``state_dict`` is unchanged (the tied LM head uses this class directly)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.w16 = weight.detach().to(F16).contiguous()  # [out, in]
        self.w32 = self.w16.float()  # the same values, for the fp32 product
        self.b16 = None if bias is None else bias.detach().to(F16)
        self.b32 = None if self.b16 is None else self.b16.float()

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] < HALF_MAX_ROWS:
            return F.linear(x.to(F16), self.w16, self.b16).float()
        return F.linear(x.to(F16).float(), self.w32, self.b32).to(F16).float()


class HalfLinear(HalfProduct):
    """A ``HalfProduct`` in place of an ``nn.Linear``: it keeps the layer's ``weight`` and
    ``bias`` as its parameters, so checkpoints see the same state dict."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__(weight, bias)
        self.weight, self.bias = weight, bias


def use_half_matmuls(model: CoupletTransformer) -> None:
    """Swap the model's linear layers and its tied LM head for fp16-weight ones, in place
    (inference only: they compute with copies made now). Idempotent."""
    for _, owner, attr in block_linears(model):
        layer = getattr(owner, attr)
        if isinstance(layer, nn.Linear):
            setattr(owner, attr, HalfLinear(layer.weight, layer.bias))
    if not isinstance(model.lm_head, HalfProduct):
        model.lm_head = HalfProduct(model.tok_emb.weight, None)
