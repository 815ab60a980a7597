"""int8 matrix products for inference on CPUs (``matmul = "int8"``).

Every linear layer and the tied LM head multiply int8 weights (one scale per output
channel) by int8-quantised activations with int32 sums (fbgemm), and return fp32; the
rest of the model - embeddings, LayerNorm, attention, the KV cache, the residual stream,
the rules - stays fp32.

**Batch-invariant by construction.** Each layer's activations are quantised with one
*fixed* scale and zero point (``ActRange``), calibrated once when the model is loaded, not
per call: PyTorch's dynamic quantisation takes the scale from the whole batch, so a row's
answer would depend on its batch companions (measured on the 800-line benchmark mix: 69
of 200 answers differed between a request alone and in a batch of 128). With a fixed scale
a row's quantised values depend on that row alone, and integer sums are exact in any order,
so a request gets the same answer alone or in any batch (``tests/unit/test_int8.py``).

**Calibration** (``calibrate``): the fp32 model writes 下联 greedily (no rules) for the
built-in sample of 上联 (``resources/sample_uppers.txt``) in every style and both
registers, and each layer's input range is recorded; a margin (``RANGE_MARGIN``) covers
inputs outside what calibration saw (they are clamped, as any int8 value is). Deterministic:
the same weights give the same ranges.

Measured on an AMD EPYC (AVX2) host with 2 threads (docs/performance.md):
the 7,703-way LM head 2.7 against 7.3 ms at 128 rows, the block layers 1.2-1.5x; the runner
on the 800-line mix at 128 rows +12-32% sequences/s, and at one row 34-37 against 59 ms.
Validation BLEU-4 3.27 against fp32's 3.29 (rules 1.0 either way); a third of the answers
differ from fp32's (near-ties of the logits), so fp32 stays the default.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from chunlian.model.tokenizer import PREFIX_LEN, Tokenizer, lower_role, upper_role
from chunlian.model.transformer import CoupletTransformer, KVCache, block_linears

# inputs outside the calibrated range by up to this share of its width still quantise
# without clamping (the range is widened on both sides)
RANGE_MARGIN = 0.1
# Without VNNI, fbgemm sums pairs of u8 x s8 products in int16 (``vpmaddubsw``), and
# 2 * 255 * 127 overflows it (measured here: one output in a few thousand off by 15% of
# its range). PyTorch gives up an activation bit for this ("reduce_range"); here the
# weights give it instead (-63..63, one scale per output channel, so every row keeps its
# own resolution): the activations, one scale per tensor and wide where a few channels
# are, need the bits more (validation BLEU-4 3.12 with 7-bit activations, WEIGHT_LEVELS
# below the same as fp32's 3.29 within noise; docs/performance.md)
QUANT_LEVELS = 255  # uint8 activations
WEIGHT_LEVELS = 63  # int8 weights, 7 bits used: 2 * 255 * 63 fits int16
REGISTERS = ("modern", "classical")


def int8_supported() -> bool:
    """fbgemm (x86 with AVX2) is in this torch build: the int8 products need it."""
    return "fbgemm" in torch.backends.quantized.supported_engines


@dataclass(frozen=True)
class ActRange:
    """A layer input's calibrated range, as the uint8 scale and zero point it implies."""

    lo: float
    hi: float

    def qparams(self) -> tuple[float, int]:
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)  # zero stays exactly representable
        span = (hi - lo) or 1e-6
        lo, hi = lo - span * RANGE_MARGIN, hi + span * RANGE_MARGIN
        scale = (hi - lo) / QUANT_LEVELS
        return scale, max(0, min(QUANT_LEVELS, round(-lo / scale)))


class Int8Linear(nn.Module):
    """``[N, in]`` fp32 -> ``[N, out]`` fp32 through int8 weights and fixed-scale int8
    activations. Keeps the fp32 ``weight`` and ``bias`` it was built from (parameters
    stay parameters), so a converted model's ``state_dict`` has the same entries."""

    def __init__(self, weight: Tensor, bias: Tensor | None, act: ActRange) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        w = weight.detach().float().contiguous()
        scales = (w.abs().amax(dim=1) / WEIGHT_LEVELS).clamp(min=1e-12).double()  # [out]
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        engine = torch.backends.quantized.engine
        with warnings.catch_warnings():  # quantised tensors are deprecated; torch is pinned
            warnings.simplefilter("ignore")
            wq = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
            b = None if bias is None else bias.detach().float()
            # fbgemm on every x86 host (the default "x86" engine may pick oneDNN where the
            # CPU has VNNI): the packed weights keep their backend, so one call site decides
            torch.backends.quantized.engine = "fbgemm"
            try:
                self.packed = torch.ops.quantized.linear_prepack(wq, b)
            finally:
                torch.backends.quantized.engine = engine
        self.x_scale, self.x_zero_point = act.qparams()

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x.contiguous(), self.x_scale, self.x_zero_point, self.packed
        )
        return y


def calibration_uppers() -> list[str]:
    """Every other line of the built-in sample of 上联 (``data.samples``, also the load
    tester's default lines): 200 lines of 4 to 27 characters."""
    from chunlian.data.samples import sample_uppers

    return sample_uppers()[::2]


@torch.inference_mode()
def calibrate(model: CoupletTransformer, tok: Tokenizer, uppers: list[str]) -> dict[str, ActRange]:
    """Input range of every linear layer (``"blocks.{i}.attn.qkv"`` ...) and of the LM
    head (``"lm_head"``), over greedy fp32 generation for ``uppers`` (styles and
    registers taking turns)."""
    seen: dict[str, list[float]] = {}
    hooks = []

    def recorder(name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple[Tensor, ...], out: Tensor | None = None) -> None:
            t = out if out is not None else args[0]
            lo, hi = float(t.min()), float(t.max())
            r = seen.setdefault(name, [lo, hi])
            r[0], r[1] = min(r[0], lo), max(r[1], hi)
        return hook

    for name, owner, attr in block_linears(model):
        hooks.append(getattr(owner, attr).register_forward_pre_hook(recorder(name)))
    hooks.append(model.ln_f.register_forward_hook(recorder("lm_head")))  # the head's input
    try:
        from chunlian.model.styles import STYLES

        # every line once, the styles and registers taking turns (rows of one batch may
        # differ in both: they are just the prefix's tokens), one batch per line length
        groups: dict[int, list[list[int]]] = {}
        for i, u in enumerate(uppers):
            style, register = STYLES[i % len(STYLES)], REGISTERS[(i // len(STYLES)) % len(REGISTERS)]
            groups.setdefault(len(u), []).append(tok.prefix(style, register) + tok.encode(u) + [tok.sep_id])
        for n, prompts in groups.items():
            _greedy(model, prompts, n)
    finally:
        for h in hooks:
            h.remove()
    return {k: ActRange(lo, hi) for k, (lo, hi) in seen.items()}


def _greedy(model: CoupletTransformer, prompts: list[list[int]], n: int) -> None:
    """Write the ``n``-character 下联 of each prompt (prefix, 上联, SEP; all of one length)
    greedily over a KV cache, without the rules: all that matters here is that the layers
    see the inputs generation gives them."""
    B, T = len(prompts), len(prompts[0])
    cache = KVCache(model.cfg, B, torch.device("cpu"), torch.float32)
    roles = [0] * PREFIX_LEN + [upper_role(i) for i in range(n)] + [lower_role(0)]
    idx = torch.tensor(prompts)  # [B, T]
    pos = torch.arange(T).expand(B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    logits = model(idx, pos, torch.tensor(roles).expand(B, T), causal, cache, select=torch.full((B,), T - 1))
    for j in range(n - 1):  # [B, V] -> the next character, fed at position T + j
        p = T + j
        at = torch.full((B,), p)
        feed = logits.argmax(dim=-1)[:, None]  # [B, 1]
        mask = torch.ones(B, 1, p + 1, dtype=torch.bool)
        role = torch.full((B, 1), lower_role(j + 1))
        logits = model(feed, at[:, None], role, mask, cache, cache_pos=at)[:, 0]


def use_int8_matmuls(model: CoupletTransformer, tok: Tokenizer, uppers: list[str]) -> dict[str, ActRange]:
    """Calibrate on ``uppers`` (fp32), then swap every linear layer and the LM head for an
    ``Int8Linear``, in place (inference only). Returns the ranges used."""
    if any(isinstance(getattr(o, a), Int8Linear) for _, o, a in block_linears(model)):
        raise ValueError("the model's linear layers are int8 already")
    ranges = calibrate(model, tok, uppers)
    for name, owner, attr in block_linears(model):
        layer = getattr(owner, attr)
        setattr(owner, attr, Int8Linear(layer.weight, layer.bias, ranges[name]))
    # the tied embedding, detached: a plain attribute, so no "lm_head.weight" in the state dict
    model.lm_head = Int8Linear(model.tok_emb.weight.detach(), None, ranges["lm_head"])
    return ranges
