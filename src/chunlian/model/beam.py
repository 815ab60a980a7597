"""Constrained beam search for 下联 lines (offline: evaluation and the CLI).

Greedy decoding commits to the single best character at every step; a beam keeps the
``width`` best partial lines of each request (by summed log-probability over the allowed
characters) and returns the best whole line. Every hypothesis carries its own
``LineState``, so the couplet rules hold for every beam exactly as for greedy decoding.

All lines of one request have the upper line's length, so hypotheses of a request are
always compared at equal length (no length normalisation is needed). Requests are grouped
by 上联 length: a group's prompts need no padding and its beams all finish at one step.

Rows of the KV cache: request ``b``'s beam ``k`` lives in row ``b * width + k``; after each
step the surviving beams' rows are gathered into place (``_reorder``). One cache of
``max_rows`` rows serves every group: each position is written before it is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from chunlian.model.checkpoint import LoadedModel
from chunlian.model.decoding import Constrainer, LineState
from chunlian.model.tokenizer import PREFIX_LEN, lower_role, sequence_roles
from chunlian.model.transformer import KVCache


@dataclass(frozen=True)
class BeamResult:
    lower: str
    mean_logprob: float  # over the characters the model chose (forced ones are not scored)
    logprob: float = 0.0  # the sum (the beam's score)


class BeamSearcher:
    """Beam search over one loaded model; ``max_rows`` bounds beams in flight (requests x width)."""

    def __init__(
        self, loaded: LoadedModel, constrainer: Constrainer, tone_bias: float, max_rows: int = 256,
    ) -> None:
        self.model = loaded.model.eval()
        self.tok = loaded.tokenizer
        self.constrainer = constrainer
        self.tone_bias = tone_bias
        self.max_rows = max_rows
        self.device = next(self.model.parameters()).device
        self._caches: list[KVCache] = []  # allocated at the first search, then reused

    def _forward(self, caches: list[KVCache], *args: Tensor | None, **kw: Tensor) -> Tensor:
        """``model(*args, cache, **kw)``."""
        return self.model(*args, caches[0], **kw)  # type: ignore[no-any-return]

    def search(self, items: Sequence[tuple[str, str]], width: int) -> list[BeamResult]:
        """Best 下联 for each ``(upper, style)``, in input order."""
        return [hyps[0] for hyps in self.search_nbest(items, width)]

    def search_nbest(self, items: Sequence[tuple[str, str]], width: int) -> list[list[BeamResult]]:
        """The final beams of each ``(upper, style)``, best first (up to ``width`` distinct
        lines; fewer where the rules leave fewer), in input order."""
        if width < 1:
            raise ValueError(f"beam width must be >= 1, got {width}")
        out: list[list[BeamResult] | None] = [None] * len(items)
        by_len: dict[int, list[int]] = {}
        for i, (upper, _) in enumerate(items):
            by_len.setdefault(len(upper), []).append(i)
        per_group = max(1, self.max_rows // width)
        rows = per_group * width
        if not self._caches or self._caches[0].rows < rows:
            self._caches = [KVCache(self.model.cfg, rows, self.device, torch.float32)]
        caches = self._caches
        for idxs in by_len.values():
            for start in range(0, len(idxs), per_group):
                chunk = idxs[start : start + per_group]
                for i, res in zip(chunk, self._group(caches, [items[i] for i in chunk], width), strict=True):
                    out[i] = res
        return [r for r in out if r is not None]

    @torch.inference_mode()
    def _group(self, caches: list[KVCache], items: list[tuple[str, str]], K: int) -> list[list[BeamResult]]:
        """Beam search for requests whose upper lines all have one length ``n``, in the first
        ``len(items) * K`` rows of each model's cache."""
        tok, dev = self.tok, self.device
        B, n = len(items), len(items[0][0])
        R = B * K
        prompts = [tok.prefix(style) + tok.encode(upper) + [tok.sep_id] for upper, style in items]
        T = len(prompts[0])  # equal for the whole group
        roles = sequence_roles(n, 0)  # prefix, 上联, SEP
        idx = torch.tensor(prompts, device=dev)  # [B, T]
        pos = torch.arange(T, device=dev).expand(B, T)
        role = torch.tensor(roles, device=dev).expand(B, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(B, T, T)
        last = torch.full((B,), T - 1, device=dev)
        logits = self._forward(caches, idx, pos, role, mask, select=last)  # [B, V]
        # every request's prompt state copied into its K beam rows
        expand = torch.arange(B, device=dev).repeat_interleave(K)  # [R]
        for cache in caches:
            self._reorder(cache, expand, 0, T)
        logits = logits[expand]
        states = [LineState(style=style, upper=upper, upper_len=n) for upper, style in items for _ in range(K)]
        # only beam 0 of each request is live at the start (the K copies are identical)
        score = torch.full((B, K), float("-inf"), device=dev)
        score[:, 0] = 0.0
        n_scored = 0
        for j in range(n):
            con = self.constrainer.apply(logits.float(), states, self.tone_bias)
            step_lp = torch.log_softmax(con.scores, dim=1)  # [R, V]
            forced_rows = [r for r, f in enumerate(con.forced) if f is not None]
            if forced_rows:  # a forced character costs nothing and is the row's only choice
                fr = torch.tensor(forced_rows, device=dev)
                fid = torch.tensor([tok.stoi.get(con.forced[r] or "", tok.unk_id) for r in forced_rows], device=dev)
                step_lp[fr] = float("-inf")
                step_lp[fr, fid] = 0.0
            if len(forced_rows) < R:
                n_scored += 1
            V = step_lp.shape[1]
            total = (score.reshape(R, 1) + step_lp).reshape(B, K * V)
            score, flat = total.topk(K, dim=1)  # [B, K], best first
            # fewer than K live continuations (first step, forced steps): a dead slot copies
            # the best one and keeps its -inf score, so it can never win
            flat = torch.where(torch.isfinite(score), flat, flat[:, :1])
            beam, ids = flat // V, flat % V
            src = (torch.arange(B, device=dev)[:, None] * K + beam).reshape(R)  # [R]
            for cache in caches:  # the j tokens fed so far; every beam of a request has its prompt
                self._reorder(cache, src, T, T + j)
            src_l, ids_l = src.tolist(), ids.reshape(R).tolist()
            new_states = []
            for r in range(R):
                st = dataclasses.replace(states[src_l[r]])
                f = con.forced[src_l[r]]
                st.push(f if f is not None else tok.itos[ids_l[r]])
                new_states.append(st)
            states = new_states
            if j == n - 1:
                break
            step_pos = PREFIX_LEN + n + 1 + j  # the new token's position (SEP is at T - 1)
            feed = torch.tensor([[tok.stoi.get(st.lower[-1], tok.unk_id)] for st in states], device=dev)
            p = torch.full((R, 1), step_pos, device=dev)
            rl = torch.full((R, 1), lower_role(j + 1), device=dev)
            m = torch.ones(R, 1, step_pos + 1, dtype=torch.bool, device=dev)
            logits = self._forward(caches, feed, p, rl, m, cache_pos=p[:, 0])[:, 0]  # [R, V]
        # topk keeps every request's beams sorted, best first; dead slots (-inf) are dropped
        score_l = score.tolist()
        return [
            [BeamResult(states[b * K + k].lower, score_l[b][k] / max(1, n_scored), score_l[b][k])
             for k in range(K) if math.isfinite(score_l[b][k])]
            for b in range(B)
        ]

    @staticmethod
    def _reorder(cache: KVCache, src: Tensor, start: int, end: int) -> None:
        """Rows ``0 .. R-1`` of the cache become rows ``src`` at positions ``start .. end-1``.

        Only positions written so far are copied (the rest is never attended to; copying all
        ``block_size`` positions took half of a width-32 search), and after the prompt's
        copy into each request's beams only the generated ones: ``src`` never leaves a
        request, whose beams share the prompt's keys and values (a third of what was left)."""
        if end <= start:
            return
        R = src.shape[0]
        cache.k[:, :R, :, start:end] = cache.k[:, src, :, start:end]
        cache.v[:, :R, :, start:end] = cache.v[:, src, :, start:end]

