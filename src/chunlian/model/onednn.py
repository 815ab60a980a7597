"""The tied LM head through oneDNN on pre-packed weights (fp32, CPU; on by default).

PyTorch's CPU ``F.linear`` calls MKL's ``sgemm``. On AMD CPUs MKL takes a generic code path,
and for the LM head's shape (``[N, 192] @ [192, 7703]``) it is slow there: oneDNN (bundled
with PyTorch; its kernels are chosen by instruction set, not by vendor), with the weight
packed once into oneDNN's blocked layout, is much faster at every row count, the most at a
few rows. The block layers are left to MKL: through oneDNN they gain a little at
128 rows, lose under 16 rows (a larger fixed cost a call), and gain nothing end to end.
Figures and how to measure them (``benchmarks/head_kernel.py``): ``docs/performance.md``.

**Same numbers.** On an AVX2 AMD EPYC, oneDNN's sums over the model width come out bitwise
equal to MKL's, and a row's logits are the same whatever the number of rows around it: the
800-line benchmark mix gives the same 800 answers at 128 rows, and 100 of them alone, as
PyTorch's kernel (``benchmarks/head_kernel.py``). The model tag is therefore unchanged.
``tests/unit/test_onednn.py`` checks the batch invariance and the closeness on the machine it
runs on.

**Row buckets.** oneDNN builds a kernel ("primitive") for every new row count, a millisecond
or two each, and caches 1,024 of them; a continuous-batching step's row count takes hundreds
of values, so from ``MIN_BUCKETED_ROWS`` rows on they are padded up to a multiple of
``ROW_BUCKET`` (the padded rows' logits are dropped); below it each row count gets its own
kernel (a lone request's step, a narrow beam).

**Intel CPUs: PyTorch's kernel from 64 rows.** MKL's own CPUs are not what the head is moved
for. On an Intel Xeon (AMX) oneDNN is the faster at 4-32 rows but the slower at 56-128 rows,
where a busy engine runs, and at 1-2 rows (``docs/performance.md``). There the head hands
``PYTORCH_FROM_ROWS`` rows and more to ``F.linear``; under it oneDNN keeps even a lone row's logits batch-invariant (MKL sums a single
row, a matrix-vector product, in another order: up to 2.5e-6 apart), and from 4 rows the two
kernels' logits are bitwise equal on both kinds of CPU, so the switch changes no answer.
``tests/unit/test_onednn.py`` checks that on the machine it runs on.

Not used on CUDA (cuBLAS is the right kernel there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chunlian.model.transformer import CoupletTransformer

MIN_BUCKETED_ROWS = 16
ROW_BUCKET = 16
PYTORCH_FROM_ROWS = 64  # on Intel CPUs (module docstring)


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``) from ``/proc/cpuinfo``, or
    ``""`` where there is none to read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read(65536)
        except OSError:
            return ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return ""


def onednn_supported() -> bool:
    """PyTorch was built with oneDNN and has its packed linear product."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return bool(available and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OnednnHead(nn.Module):
    """The tied LM head on oneDNN: hidden ``[N, D]`` -> logits ``[N, vocab]``. The packed
    weight is a plain attribute (a copy made now), so the model's state dict is unchanged;
    inference only. ``pytorch_from_rows``: from this many rows on, PyTorch's ``F.linear``
    on the weight itself instead (None: never)."""

    def __init__(self, weight: Tensor, pytorch_from_rows: int | None = None) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
        self.weight = weight.detach()  # the tied embedding itself (no copy), for F.linear
        self.pytorch_from_rows = pytorch_from_rows

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        if self.pytorch_from_rows is not None and n >= self.pytorch_from_rows:
            return F.linear(x, self.weight)
        pad = -n % ROW_BUCKET if n >= MIN_BUCKETED_ROWS else 0
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        y: Tensor = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, None, "none", [], "")
        return y[:n] if pad else y


def use_onednn_head(model: CoupletTransformer) -> None:
    """Give an fp32 CPU model the oneDNN head, in place (idempotent; a model whose head a
    lower precision has swapped keeps it); on an Intel CPU it hands large batches to PyTorch's
    kernel (module docstring)."""
    if model.lm_head is None:
        switch = PYTORCH_FROM_ROWS if cpu_vendor() == "GenuineIntel" else None
        model.lm_head = OnednnHead(model.tok_emb.weight, switch)
