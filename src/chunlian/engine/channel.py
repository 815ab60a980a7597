"""Channel scores: how well a 下联 explains its 上联, for reranking beam candidates.

A beam ranks candidate 下联 lines by ``log p(lower | upper)``, which favours safe, generic
lines (stock festive words fit almost any 上联). The *channel* score
``log p(upper | lower)`` asks the reverse question - would this 下联 call for this very
上联? - and so rewards lines that answer the 上联 specifically (the noisy-channel / MMI
reranking of machine translation and dialogue). The final choice maximises::

    log p(lower | upper) + weight * log p(upper | lower)

(``engine.rescore`` adds the terms up for the beams the engine core finishes.)

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

import dataclasses
from collections.abc import Sequence

import torch

from chunlian.model.checkpoint import LoadedModel
from chunlian.model.tokenizer import lower_role, sequence_roles
from chunlian.model.transformer import KVCache


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
        for i, (upper, lower, _) in enumerate(triples):
            if len(upper) != len(lower):
                raise ValueError(f"upper and lower differ in length: {upper!r} / {lower!r}")
            by_len.setdefault(len(upper), []).append(i)
        # (given line, scored line, style): the reading is ``prefix given [SEP] scored``
        reads = [(upper, lower, style) if self.forward else (lower, upper, style) for upper, lower, style in triples]
        for idxs in by_len.values():
            for start in range(0, len(idxs), self.batch_rows):
                chunk = idxs[start : start + self.batch_rows]
                for i, s in zip(chunk, self._score_group([reads[i] for i in chunk]), strict=True):
                    out[i] = s
        return out

    @torch.inference_mode()
    def _score_group(self, reads: list[tuple[str, str, str]]) -> list[float]:
        """``log p(scored | given)`` of ``(given, scored, style)`` reads whose lines all have
        one length ``n``, teacher-forced through a KV cache in two passes: the distinct
        prompts ``prefix given [SEP]`` once each (the rescoring pass's candidates all share
        their request's prompt: 32 candidates, one prompt), then every row's ``scored[:-1]``
        after its prompt's keys and values. The prompt's last position predicts ``scored[0]``."""
        tok, dev, cfg = self.tok, self.device, self.model.cfg
        n = len(reads[0][0])
        prompt_of: dict[tuple[str, str], int] = {}
        src = [prompt_of.setdefault((given, style), len(prompt_of)) for given, _, style in reads]  # [R]
        prompts = [tok.prefix(style, self.register) + tok.encode(given) + [tok.sep_id] for given, style in prompt_of]
        P, R, T = len(prompts), len(reads), len(prompts[0])  # T = PREFIX_LEN + n + 1
        # a cache just long enough for this group (the model's block_size would zero ~4x more)
        cache = KVCache(dataclasses.replace(cfg, block_size=T + n - 1), max(P, R), dev, torch.float32)
        idx = torch.tensor(prompts, device=dev)  # [P, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        first = self.model(idx, torch.arange(T, device=dev).expand(P, T),
                           torch.tensor(sequence_roles(n, 0), device=dev).expand(P, T), causal.expand(P, T, T),
                           cache, select=torch.full((P,), T - 1, device=dev))  # [P, V]: predicts scored[0]
        rows = torch.tensor(src, device=dev)
        target = torch.tensor([tok.encode(scored) for _, scored, _ in reads], device=dev)  # [R, n]
        lp0 = torch.log_softmax(first.float(), dim=-1)[rows]  # [R, V]
        parts = [lp0.gather(1, target[:, :1])]  # [R, 1]
        if n > 1:  # every row's scored[:-1] after its prompt: positions T .. T+n-2
            if P < R:  # each row gets its prompt's keys and values (rows 0 .. P-1 hold them)
                cache.k[:, :R, :, :T] = cache.k[:, rows, :, :T]
                cache.v[:, :R, :, :T] = cache.v[:, rows, :, :T]
            m = n - 1
            mask = torch.ones(m, T + m, dtype=torch.bool, device=dev).tril(diagonal=T).expand(R, m, T + m)
            roles = torch.tensor([lower_role(j) for j in range(1, n)], device=dev).expand(R, m)
            rest = self.model(target[:, :m], torch.arange(T, T + m, device=dev).expand(R, m), roles, mask, cache)
            parts.append(torch.log_softmax(rest.float(), dim=-1).gather(2, target[:, 1:, None])[..., 0])  # [R, m]
        lp = torch.cat(parts, dim=1)  # [R, n]
        known = target != tok.unk_id
        return (lp * known).sum(dim=1).tolist()
