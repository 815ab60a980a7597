"""Training batches: pairs grouped by (source, length), drawn at each source's share.

A batch holds pairs of one source and one line length, so it needs no padding; long lines
get fewer pairs a batch, keeping the tokens per step about constant.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from chunlian.data.corpus import Pair
from chunlian.model.styles import derive_style
from chunlian.model.tokenizer import Tokenizer, sequence_roles


def encode_batch(
    tok: Tokenizer, pairs: list[Pair], styles: list[str], upper_weight: float, device: str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Same-length pairs -> (idx, pos, role, targets, weights), each ``[B, 2n+4]``."""
    n = len(pairs[0].upper)
    rows = []
    for p, s in zip(pairs, styles, strict=True):
        rows.append(
            tok.prefix(s, p.register) + tok.encode(p.upper) + [tok.sep_id] + tok.encode(p.lower)
            + [tok.eos_id]
        )
    seq = torch.tensor(rows, dtype=torch.long)  # [B, 2n+5]
    idx, tgt = seq[:, :-1], seq[:, 1:]
    T = idx.shape[1]
    pos = torch.arange(T).expand_as(idx)
    role = torch.tensor(sequence_roles(n, n)).expand_as(idx)
    w = torch.zeros(T)
    w[2 : 2 + n] = upper_weight  # targets u_0..u_{n-1}
    w[3 + n :] = 1.0  # targets l_0..l_{n-1}, EOS
    weights = w.expand_as(idx).clone()
    weights[tgt == tok.unk_id] = 0.0
    return idx.to(device), pos.to(device), role.to(device), tgt.to(device), weights.to(device)


REVERSED = "reversed"  # the register and source of reversed pairs (token <r:reversed>)


def reversed_pairs(pairs: list[Pair]) -> list[Pair]:
    """The modern-register pairs the other way round, in their own register (validation
    pairs are never among them: they are not in the training split)."""
    return [Pair(upper=p.lower, lower=p.upper, register=REVERSED, source=REVERSED) for p in pairs
            if p.register == "modern" and p.lower != p.upper]


def source_shares(mix: dict[str, float], sizes: dict[str, int]) -> dict[str, float]:
    """The share of batches of each source present: the named ones as given, the rest of
    1.0 split among the unnamed ones by size (or the named ones scaled up if none is left)."""
    absent = sorted(s for s, v in mix.items() if v > 0 and not sizes.get(s))
    if absent:
        raise ValueError(f"--mix names sources the training data does not hold: {', '.join(absent)}"
                         f" (it holds {', '.join(sorted(sizes))})")
    named = {s: v for s, v in mix.items() if sizes.get(s)}
    others = {s: n for s, n in sizes.items() if s not in named and n}
    rest = max(0.0, 1.0 - sum(named.values()))
    shares = dict(named)
    total_others = sum(others.values())
    for s, n in others.items():
        shares[s] = rest * n / total_others
    if not others:
        scale = sum(named.values())
        if scale <= 0:
            raise ValueError(f"--mix gives every source a share of 0: {mix}")
        shares = {s: v / scale for s, v in named.items()}
    return shares


class Buckets:
    """Pairs grouped by (source, length), sampled by weight; one bucket per batch."""

    def __init__(self, pairs: list[Pair], mix: dict[str, float], rng: random.Random) -> None:
        self.rng = rng
        self.groups: dict[tuple[str, int], list[tuple[Pair, str]]] = {}
        for p in pairs:
            # a reversed pair's style comes from the forward pair (derive_style reads both lines)
            register = "modern" if p.register == REVERSED else p.register
            self.groups.setdefault((p.source, len(p.upper)), []).append(
                (p, derive_style(p.upper, p.lower, register)))
        self.keys = sorted(self.groups)
        sizes: dict[str, int] = {}
        for (src, _), g in self.groups.items():
            sizes[src] = sizes.get(src, 0) + len(g)
        self.shares = source_shares(mix, sizes)
        self.weights = [self.shares[s] * len(self.groups[(s, n)]) / sizes[s] for s, n in self.keys]

    def sample(self, batch_pairs: int) -> tuple[list[Pair], list[str]]:
        key = self.rng.choices(self.keys, weights=self.weights)[0]
        group = self.groups[key]
        # Long lines get fewer pairs per batch: keep tokens per batch roughly constant.
        n = key[1]
        k = min(len(group), max(16, batch_pairs * 7 // max(7, n)))
        picked = self.rng.sample(group, k)
        return [p for p, _ in picked], [s for _, s in picked]
