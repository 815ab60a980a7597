"""Sampling a token from constrained logits: top-k then top-p, at a temperature, per seed.

Each sequence draws from its own ``torch.Generator`` (seeded from its request), so a
request's output depends on its seed only, never on its batch companions. Rows with a
top-k of at most ``MAX_BATCHED_TOP_K`` are sampled together (``sample_top_k``); the rest one
at a time (``sample_one``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from chunlian.engine.request import SeqSpec

MAX_BATCHED_TOP_K = 1024  # rows sampling with a larger (or no) top-k take the per-row path


def sample_top_k(logits: Tensor, specs: list[SeqSpec], gens: list[torch.Generator | None]) -> Tensor:
    """Top-k, then top-p, sampling for several rows at once (``[S, V]`` -> ``[S]`` ids).

    One ``topk`` over the batch instead of a few ops per row; each row's draw is one
    uniform number from its own generator (inverse CDF), so a request's output depends
    on its seed only, never on its batch companions.
    """
    k_max = max(s.top_k for s in specs)
    temps = torch.tensor([max(s.temperature, 1e-4) for s in specs], device=logits.device)
    vals, ids = torch.topk(logits / temps[:, None], min(k_max, logits.shape[1]), dim=-1)  # [S, K]
    K = vals.shape[1]
    rank = torch.arange(K, device=logits.device)[None, :]
    k_row = torch.tensor([s.top_k for s in specs], device=logits.device)[:, None]
    vals = vals.masked_fill(rank >= k_row, float("-inf"))
    probs = torch.softmax(vals, dim=-1)  # sorted, descending
    top_p = torch.tensor([s.top_p for s in specs], device=logits.device)[:, None]
    vals = vals.masked_fill(probs.cumsum(dim=-1) - probs > top_p, float("-inf"))  # keeps rank 0
    cdf = torch.softmax(vals, dim=-1).cumsum(dim=-1).cpu()  # [S, K]
    u = torch.cat([torch.rand(1, generator=g) for g in gens])[:, None] * cdf[:, -1:]
    pick = torch.searchsorted(cdf, u).clamp_(max=K - 1).to(logits.device)  # [S, 1]
    out = ids.gather(1, pick)[:, 0]
    # a row with no finite choice (cannot happen with the rules' fallback) keeps its argmax
    bad = ~torch.isfinite(vals[:, 0])
    if bool(bad.any()):
        out[bad] = logits[bad].argmax(dim=-1)
    return out


def sample_one(logits: Tensor, s: SeqSpec, gen: torch.Generator | None) -> int:
    """One row (``[V]`` -> an id): the path for a top-k above ``MAX_BATCHED_TOP_K`` or none."""
    x = logits / max(s.temperature, 1e-4)
    if s.top_k and s.top_k < x.numel():
        kth = torch.topk(x, s.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        cut = cum - torch.softmax(sorted_x, dim=-1) > s.top_p
        sorted_x = sorted_x.masked_fill(cut, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1).cpu()
    if not math.isfinite(float(probs.sum())):
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs, 1, generator=gen))
