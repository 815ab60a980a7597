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
from torch import Tensor

from chunlian.model.checkpoint import LoadedModel
from chunlian.model.tokenizer import sequence_roles
from chunlian.model.transformer import GroupInput, KVCache


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
        # (given line, scored line, style): the reading is ``prefix given [SEP] scored``;
        # a request's candidates share its 上联 and style: one prompt tree (``_score_trees``)
        reads = [(upper, lower, style) if self.forward else (lower, upper, style) for upper, lower, style in triples]
        for idxs in by_len.values():
            for start in range(0, len(idxs), self.batch_rows):
                chunk = idxs[start : start + self.batch_rows]
                keys = [(triples[i][0], triples[i][2]) for i in chunk]
                for i, sc in zip(chunk, self._score_trees([reads[i] for i in chunk], keys), strict=True):
                    out[i] = sc
        return out

    @torch.inference_mode()
    def _score_trees(self, reads: list[tuple[str, str, str]], keys: list[tuple[str, str]]) -> list[float]:
        """``log p(scored | given)`` of ``(given, scored, style)`` reads whose lines all have
        one length ``n``, teacher-forced as prefix trees (``_Tree``): a beam's lines share
        most of their characters, and each shared prefix is computed once.

        Pass 1: the prompts ``prefix given [SEP]`` of one key (a request: its candidates)
        are one tree, one row. Pass 2: the ``scored[:-1]`` continuations after one prompt
        are one tree, one row, after its prompt's keys and values (gathered from pass 1):
        the channel reading has one prompt per candidate and one shared 上联, the forward
        reading one shared prompt and the candidates' tree. A token attends to its
        ancestors only; absolute position embeddings make its slot in a row irrelevant."""
        tok, dev = self.tok, self.device
        n = len(reads[0][0])
        roles = torch.tensor(sequence_roles(n, n - 1))  # prefix + given + [SEP] + scored[:-1]
        T = len(roles) - (n - 1)  # prompt length: its last token predicts scored[0]
        prompts: dict[tuple[str, str], _Tree] = {}
        conts: dict[tuple[int, int], _Tree] = {}  # (prompt row, SEP node) -> continuation tree
        at: list[tuple[int, int, int, list[int]]] = []  # per read: prompt row, SEP node, cont row, its nodes
        for (given, scored, style), key in zip(reads, keys, strict=True):
            pt = prompts.setdefault(key, _Tree(len(prompts)))
            sep = pt.insert(tok.prefix(style, self.register) + tok.encode(given) + [tok.sep_id])[-1]
            ct = conts.setdefault((pt.row, sep), _Tree(len(conts)))
            at.append((pt.row, sep, ct.row, ct.insert(tok.encode(scored)[:-1])))
        n1 = max(len(t.tokens) for t in prompts.values())
        trees = list(conts.values())
        m = max(len(t.tokens) for t in trees)
        cfg = self.model.cfg  # caches just long enough (the model's block_size would zero ~4x more)
        cache = KVCache(dataclasses.replace(cfg, block_size=n1), len(prompts), dev, torch.float32)
        hs = [self.model.hidden_groups([_tree_input(list(prompts.values()), n1, 0, roles, dev)], cache)]
        # each read's hidden state before each scored character: its [SEP], then its continuation
        flat = [[p * n1 + sep] + [len(prompts) * n1 + c * m + node for node in nodes] for p, sep, c, nodes in at]
        if m:
            path = torch.tensor(_prompt_paths(prompts, conts), device=dev)  # [C, T]
            src = torch.tensor([p for p, _ in conts], device=dev)
            rest = KVCache(dataclasses.replace(cfg, block_size=T + m), len(trees), dev, torch.float32)
            for kv, kv1 in ((rest.k, cache.k), (rest.v, cache.v)):  # each row: its prompt's keys and values
                kv[:, :, :, :T] = kv1[:, src[:, None], :, path].permute(2, 0, 3, 1, 4)
            hs.append(self.model.hidden_groups([_tree_input(trees, m, T, roles, dev)], rest))
        wanted: dict[int, int] = {}  # hidden row -> its row of ``lp`` (shared nodes: once)
        index = [[wanted.setdefault(f, len(wanted)) for f in fs] for fs in flat]
        h = torch.cat(hs)[torch.tensor(list(wanted), device=dev)]
        lp = torch.log_softmax(self.model.head(h).float(), dim=-1)  # [W, V]
        target = torch.tensor([tok.encode(scored) for _, scored, _ in reads], device=dev)  # [R, n]
        got = lp[torch.tensor(index, device=dev), target]  # [R, n]
        return (got * (target != tok.unk_id)).sum(dim=1).tolist()


def _prompt_paths(prompts: dict[tuple[str, str], _Tree], conts: dict[tuple[int, int], _Tree]) -> list[list[int]]:
    """The pass-1 nodes of each continuation row's prompt, root to [SEP]."""
    by_row = {t.row: t for t in prompts.values()}
    return [by_row[p].path_to(sep) for p, sep in conts]


def _tree_input(trees: list[_Tree], width: int, cached: int, roles: Tensor, dev: torch.device) -> GroupInput:
    """One row per tree (``width`` nodes, padded), after ``cached`` positions every node
    attends to: ``mask [B, width, cached + width]``, a padding node attending to itself."""
    B = len(trees)
    idx = torch.zeros(B, width, dtype=torch.long)
    depth = torch.zeros(B, width, dtype=torch.long)
    mask = torch.zeros(B, width, cached + width, dtype=torch.bool)
    mask[:, :, :cached] = True
    mask[:, :, cached:] |= torch.eye(width, dtype=torch.bool)
    for t in trees:
        k = len(t.tokens)
        idx[t.row, :k] = torch.tensor(t.tokens)
        depth[t.row, :k] = torch.tensor(t.depth)
        mask[t.row, t.anc_q, [cached + a for a in t.anc_k]] = True
    pos = depth + cached
    return GroupInput(idx.to(dev), pos.to(dev), roles[pos].to(dev), mask.to(dev))


class _Tree:
    """The prefix tree of one row: ``tokens`` and ``depth`` per node (parents first), and
    the (query, key) pairs of every node's ancestors and itself (``anc_q``, ``anc_k``)."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.tokens: list[int] = []
        self.depth: list[int] = []
        self.anc_q: list[int] = []
        self.anc_k: list[int] = []
        self._child: dict[tuple[int, int], int] = {}  # (parent node or -1, token) -> node

    def insert(self, seq: list[int]) -> list[int]:
        """Add ``seq`` as a path from the root; the node of each of its positions."""
        path: list[int] = []
        parent = -1
        for d, t in enumerate(seq):
            node = self._child.get((parent, t))
            if node is None:
                node = self._child[(parent, t)] = len(self.tokens)
                self.tokens.append(t)
                self.depth.append(d)
                self.anc_q += [node] * (d + 1)
                self.anc_k += path + [node]
            path.append(node)
            parent = node
        return path

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root to ``node``."""
        return [k for q, k in zip(self.anc_q, self.anc_k, strict=True) if q == node]
