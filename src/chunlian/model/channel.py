"""Channel scores: how well a 下联 explains its 上联, for reranking beam candidates.

A beam ranks candidate 下联 lines by ``log p(lower | upper)``, which favours safe, generic
lines (stock festive words fit almost any 上联). The *channel* score
``log p(upper | lower)`` asks the reverse question - would this 下联 call for this very
上联? - and so rewards lines that answer the 上联 specifically (the noisy-channel / MMI
reranking of machine translation and dialogue). The final choice maximises::

    log p(lower | upper) + weight * log p(upper | lower)

Both terms are sums over the line's characters; every candidate of one request has the
上联's length, so no length normalisation is needed. A third, optional term adds a second
model's forward score ``log p(lower | upper)`` (``forward=True``): in the quality preset the
beam runs on the reverse-trained weights and the shipped ones vote on its candidates.

The reverse direction is the same model on the sequence
``[BOS][STYLE][REGISTER] lower [SEP] upper``. Weights trained with reversed pairs
(``chunlian train --augment-reverse``) have a register token for exactly this,
``<r:reversed>``; other weights use ``<r:modern>`` (couplets read almost the same both
ways round, and those weights were trained on 上联 lines too). The channel term is the
model's own distribution: no rule masks (the 上联 is given, not generated).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from chunlian.model.beam import BeamResult
from chunlian.model.checkpoint import LoadedModel
from chunlian.model.tokenizer import sequence_roles


class ChannelScorer:
    """``log p(upper | lower)`` for (upper, lower, style) triples, batched by line length.

    ``forward=True`` scores the other way, ``log p(lower | upper)`` under ``<r:modern>``:
    a second model's opinion of a candidate, for reranking with more than one model."""

    def __init__(self, loaded: LoadedModel, batch_rows: int = 256, forward: bool = False) -> None:
        self.model = loaded.model.eval()
        self.tok = loaded.tokenizer
        self.forward = forward
        self.register = "reversed" if self.tok.has_register("reversed") and not forward else "modern"
        self.batch_rows = batch_rows
        self.device = next(self.model.parameters()).device

    def score(self, triples: Sequence[tuple[str, str, str]]) -> list[float]:
        """Summed log-probability of each 上联's characters given its 下联, in input order.
        Characters outside the vocabulary are not scored (they cost every candidate alike)."""
        out = [0.0] * len(triples)
        by_len: dict[int, list[int]] = {}
        if self.forward:  # score the 下联 given the 上联: the same reading, the lines swapped
            triples = [(lower, upper, style) for upper, lower, style in triples]
        for i, (upper, lower, _) in enumerate(triples):
            if len(upper) != len(lower):
                raise ValueError(f"upper and lower differ in length: {upper!r} / {lower!r}")
            by_len.setdefault(len(upper), []).append(i)
        for idxs in by_len.values():
            for start in range(0, len(idxs), self.batch_rows):
                chunk = idxs[start : start + self.batch_rows]
                for i, s in zip(chunk, self._score_group([triples[i] for i in chunk]), strict=True):
                    out[i] = s
        return out

    @torch.inference_mode()
    def _score_group(self, triples: list[tuple[str, str, str]]) -> list[float]:
        tok, dev = self.tok, self.device
        n = len(triples[0][0])
        # [BOS][STYLE][REG] lower [SEP] upper: the 上联 is predicted in the 下联's role
        rows = [tok.prefix(style, self.register) + tok.encode(lower) + [tok.sep_id] + tok.encode(upper)
                for upper, lower, style in triples]
        seq = torch.tensor(rows, device=dev)  # [B, 2n+4]
        idx, tgt = seq[:, :-1], seq[:, 1:]  # [B, 2n+3]
        B, T = idx.shape
        pos = torch.arange(T, device=dev).expand(B, T)
        role = torch.tensor(sequence_roles(n, n - 1), device=dev).expand(B, T)
        # targets from index 3 + n on are the 上联's characters (after SEP): the last n
        # positions' logits only (the rest would be most of the pass's head and softmax)
        logp = torch.log_softmax(self.model(idx, pos, role, last=n).float(), dim=-1)  # [B, n, V]
        up_tgt = tgt[:, 3 + n :]  # [B, n]
        upper_lp = logp.gather(2, up_tgt[..., None])[..., 0]  # [B, n]
        known = up_tgt != tok.unk_id
        return (upper_lp * known).sum(dim=1).tolist()


def candidate_scores(
    models: Sequence[LoadedModel], items: Sequence[tuple[str, str]], nbest: Sequence[Sequence[BeamResult]],
    forward: bool = False,
) -> list[list[float]]:
    """The channel score (``forward``: the forward score, ``log p(lower | upper)``) of every
    candidate of every ``(upper, style)`` request, averaged over ``models`` (one model, or
    an ensemble's members), shaped like ``nbest``."""
    triples = [(upper, h.lower, style) for (upper, style), hyps in zip(items, nbest, strict=True) for h in hyps]
    per_model = [ChannelScorer(m, forward=forward).score(triples) for m in models]
    flat = iter([sum(col) / len(col) for col in zip(*per_model, strict=True)])
    return [[next(flat) for _ in hyps] for hyps in nbest]


Scores = Sequence[Sequence[float]]  # one float per candidate of each request, shaped like nbest


def rerank(nbest: Sequence[Sequence[BeamResult]], *terms: tuple[float, Scores]) -> list[BeamResult]:
    """Each request's candidate with the best ``logprob + sum(weight * score)`` over the
    ``(weight, scores)`` terms (ties: the beam's order)."""
    def total(r: int, k: int, h: BeamResult) -> float:
        return h.logprob + sum(w * sc[r][k] for w, sc in terms)

    return [max(enumerate(hyps), key=lambda kh: total(r, kh[0], kh[1]))[1] for r, hyps in enumerate(nbest)]
