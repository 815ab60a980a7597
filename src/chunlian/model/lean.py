"""A decode step without the model's per-module Python: the same operations, bit for bit.

A continuous-batching engine spends most steps decoding only (one new token a live row, no
prompt joining), and a lone request's steps are all of that kind. At one row the model's
products are small and a step's time is largely Python: some fifty module calls (hooks
checks, attribute lookups), the ``Group`` bookkeeping that mixes decode and prefill rows,
and no-op dtype conversions. This path skips them: a one-row or few-row decode step takes
markedly less time than through the general ``forward_groups``; at a step of 128 rows
the products dominate and it changes little (``docs/performance.md``).

``decode_step(model, gi, cache)`` is ``model.forward_groups([gi], cache)`` for one decode
group: the embeddings, the additive mask, then per block LayerNorm, the QKV product, the
cache writes at each row's position, attention over the first ``S`` positions, the output
projection and the MLP, in the same order and with the same kernels, and the model's own
head. It falls back to ``forward_groups`` in training, for a prefill group, or when a
block's linear layers are not plain ``nn.Linear`` ones (their modules' own calls matter).
Module hooks are not called on this path.
``tests/unit/test_lean.py`` checks the logits and the cache against ``forward_groups``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chunlian.model.transformer import (
    Block,
    CoupletTransformer,
    GroupInput,
    KVCache,
    decode_positions,
)

# per block: ln1 (w, b), qkv (w, b), proj (w, b), ln2 (w, b), fc (w, b), out (w, b)
BlockParams = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


def _plain_params(model: CoupletTransformer) -> list[BlockParams] | None:
    """Each block's parameters when all its linear layers are plain ``nn.Linear`` (fp32
    inference), else None. Read at every step: a precision may be swapped in after load."""
    out: list[BlockParams] = []
    for block in model.blocks:
        assert isinstance(block, Block)
        attn = block.attn
        qkv, proj, fc, mlp_out = attn.qkv, attn.proj, block.fc, block.out
        if not (type(qkv) is type(proj) is type(fc) is type(mlp_out) is nn.Linear):
            return None
        if block.ln1.eps != model.ln_f.eps or block.ln2.eps != model.ln_f.eps:
            return None  # one eps for every LayerNorm below (the model's never differ)
        out.append((block.ln1.weight, block.ln1.bias, qkv.weight, qkv.bias, proj.weight, proj.bias,
                    block.ln2.weight, block.ln2.bias, fc.weight, fc.bias, mlp_out.weight, mlp_out.bias))
    return out


def decode_step(model: CoupletTransformer, gi: GroupInput, cache: KVCache) -> Tensor:
    """Logits ``[B, vocab]`` of one decode group (``gi``: ``[B, 1]`` tokens, ``cache_pos`` set):
    what ``model.forward_groups([gi], cache)`` returns, and the same cache writes."""
    cache_pos = gi.cache_pos
    lean = not model.training and cache_pos is not None and gi.select is None
    params = _plain_params(model) if lean and cache.k.dtype == model.tok_emb.weight.dtype else None
    if params is None or cache_pos is None:
        return model.forward_groups([gi], cache)
    cfg = model.cfg
    B = gi.idx.shape[0]
    D, H = cfg.d_model, cfg.n_head
    hd = D // H
    scale = 1.0 / math.sqrt(hd)
    eps = model.ln_f.eps
    x = (model.tok_emb(gi.idx) + model.pos_emb(gi.pos) + model.role_emb(gi.role)).view(B, D)  # [B, D]
    bias = torch.zeros(gi.mask.shape, dtype=x.dtype, device=x.device)
    bias = bias.masked_fill_(~gi.mask, float("-inf"))[:, None]  # [B, 1, 1, S]
    S = bias.shape[-1]
    flat_pos = decode_positions(cache_pos, H, cache.k.shape[3], gi.row0)  # [B * H]
    r0, r1 = gi.row0, gi.row0 + B
    for layer, (l1w, l1b, qw, qb, pw, pb, l2w, l2b, fw, fb, ow, ob) in enumerate(params):
        qkv = F.linear(F.layer_norm(x, (D,), l1w, l1b, eps), qw, qb).view(B, 1, 3 * D)
        q = qkv[..., :D].reshape(B, 1, H, hd).transpose(1, 2)  # [B, H, 1, hd]
        k = qkv[..., D : 2 * D].reshape(B, 1, H, hd).transpose(1, 2)
        v = qkv[..., 2 * D :].reshape(B, 1, H, hd).transpose(1, 2)
        ck, cv = cache.k[layer], cache.v[layer]  # [rows, H, max_len, hd]
        ck.view(-1, hd).index_copy_(0, flat_pos, k.reshape(B * H, hd))
        cv.view(-1, hd).index_copy_(0, flat_pos, v.reshape(B * H, hd))
        att = q @ ck[r0:r1, :, :S].transpose(-2, -1)  # [B, H, 1, S]
        att = F.softmax(att.mul_(scale).add_(bias), dim=-1)
        y = (att @ cv[r0:r1, :, :S]).transpose(1, 2).reshape(B, D)
        x = x + F.linear(y, pw, pb)
        x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (D,), l2w, l2b, eps), fw, fb)), ow, ob)
    return model.head(x)
