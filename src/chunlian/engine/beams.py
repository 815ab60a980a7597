"""One step of every beam search in a batch: choose, reparent, fan out (``ModelRunner._emit``).

Each group (``rows.BeamGroup``) keeps the ``width`` best partial lines by summed
log-probability under the rule-masked distribution; every beam carries its own
``LineState``, so the couplet rules hold for every beam exactly as for greedy decoding. A
step ranks all ``len(rows) x V`` continuations of a group at once (``topk``). A parent's
first child stays in the parent's row; only a further child is written to another row (one
whose beam left no child), and has its generated keys and values gathered there (the
prompt's are the same for every beam of the group and are not copied again).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from chunlian.engine.rows import BeamGroup, Row
from chunlian.model.tokenizer import Tokenizer, lower_role, upper_role
from chunlian.model.transformer import KVCache


def advance(
    scores: Tensor, forced: list[str | None], batch_rows: list[Row], beam_idx: list[int],
    live: list[Row], cache: KVCache, tok: Tokenizer,
) -> None:
    """Advance the beams among ``batch_rows`` (their indexes ``beam_idx`` into ``scores``,
    ``[B, V]`` constrained scores, ``-inf`` = not allowed). ``live`` is the runner's row list
    (KV row ``i`` = ``live[i]``): a group fanning out appends its new rows to it."""
    by_group: dict[int, BeamGroup] = {}
    for b in beam_idx:
        g = batch_rows[b].group
        assert g is not None
        by_group[id(g)] = g
    in_batch = {id(batch_rows[b]): b for b in beam_idx}
    lp = torch.log_softmax(scores[torch.tensor(beam_idx, device=scores.device)], dim=1)
    at = {b: k for k, b in enumerate(beam_idx)}
    moves: list[tuple[Row, Row, int]] = []  # (destination, source, first position to copy)
    for g in by_group.values():
        bs = [in_batch[id(r)] for r in g.rows]  # best first, as ``g.score``
        moves += _advance_group(g, list(g.rows), lp[[at[b] for b in bs]], [forced[b] for b in bs], live, tok)
    _copy_kv(moves, live, cache)


def _advance_group(
    g: BeamGroup, members: list[Row], lp: Tensor, forced: list[str | None], live: list[Row], tok: Tokenizer,
) -> list[tuple[Row, Row, int]]:
    """One step of group ``g`` whose rows ``members`` (best first) have step log-probabilities
    ``lp`` ``[k, V]``; returns the keys and values its new layout needs."""
    forced_rows = [k for k, f in enumerate(forced) if f is not None]
    # a forced character is the row's only choice; it costs nothing, except in the search of
    # a whole composed couplet, whose 上联 is chosen by how well the 下联 under the name's
    # second head follows it: there the head's own probability counts
    scores_forced = members[0].spec.composed_search
    if forced_rows:
        fr = torch.tensor(forced_rows, device=lp.device)
        fid = torch.tensor([tok.stoi.get(forced[k] or "", tok.unk_id) for k in forced_rows], device=lp.device)
        # a head the rules mask (outside the vocabulary: <unk>) costs nothing, as elsewhere
        kept = lp[fr, fid].nan_to_num(neginf=0.0) if scores_forced else 0.0
        lp[fr] = float("-inf")
        lp[fr, fid] = kept
    if scores_forced or len(forced_rows) < len(members):
        g.n_scored += 1
    prev = g.score if g.score is not None else torch.zeros(1, device=lp.device)
    V = lp.shape[1]
    top, flat = (prev[:, None] + lp).reshape(-1).topk(g.width)  # best first
    # fewer than ``width`` live continuations (forced steps): a dead slot copies the best one
    # and keeps its -inf score, so it can never win
    flat = torch.where(torch.isfinite(top), flat, flat[:1])
    src_l, ids_l = (flat // V).tolist(), (flat % V).tolist()
    first = g.score is None
    if first:  # the prompt's row fans out: new rows, the prompt's keys and values copied in
        g.gen_start = members[0].next_pos
        for _ in range(g.width - len(members)):
            row = dataclasses.replace(members[0])
            live.append(row)
            members.append(row)
    parents = [(members[s], dataclasses.replace(members[s].state), forced[s]) for s in src_l]
    moves = []
    for k, (dst, (parent, state, f), tid) in enumerate(zip(_placed(members, src_l), parents, ids_l, strict=True)):
        if dst is not parent:
            moves.append((dst, parent, 0 if first else g.gen_start))
        ch = f if f is not None else tok.itos[tid]
        # a composed couplet's search (``SeqSpec.composed_search``) chooses 上联 characters
        # first; once its 上联 is complete the separator is fed next (``ModelRunner._emit``)
        was_upper = state.phase == "upper"
        dst.next_role = upper_role(len(state.upper)) if was_upper else lower_role(len(state.lower) + 1)
        state.push(ch)
        dst.pending_sep = was_upper and state.phase == "lower"
        dst.state, dst.next_id = state, tok.stoi.get(ch, tok.unk_id)
        dst.next_pos = parent.next_pos
        dst.group = g
        if k == 0:
            g.rows = []
        g.rows.append(dst)
    g.score = top
    return moves


def _placed(members: list[Row], src_l: list[int]) -> list[Row]:
    """The row each new beam (best first; ``src_l``: its parent's index in ``members``) is
    written to: a parent's first child stays in the parent's own row, whose keys and values
    are already its prefix; only the further children take the rows of parents left without
    children, and only those rows are copied (``_copy_kv``). A row's place in the cache does
    not change what is computed for it, so the beams' scores are the same as with any layout."""
    placed: list[Row | None] = [None] * len(src_l)
    kept: set[int] = set()
    for k, s in enumerate(src_l):
        if s not in kept:
            kept.add(s)
            placed[k] = members[s]
    free = iter([m for i, m in enumerate(members) if i not in kept])
    return [p if p is not None else next(free) for p in placed]


def _copy_kv(moves: list[tuple[Row, Row, int]], live: list[Row], cache: KVCache) -> None:
    """Copy each destination row's keys and values from its source row: positions from the
    move's start to the source's latest written one. Sources and destinations are disjoint
    (``_placed``: a source keeps a child, a destination had none), so the order is free.
    One sliced copy per row: a move spans a few positions of every layer, and an
    ``index_select`` over that strided span costs several times more (``docs/performance.md``)."""
    if not moves:
        return
    index = {id(r): i for i, r in enumerate(live)}
    for d, s, start in moves:
        di, si, end = index[id(d)], index[id(s)], s.next_pos
        for kv in (cache.k, cache.v):
            kv[:, di, :, start:end].copy_(kv[:, si, :, start:end])
