"""A character-level causal Transformer for couplets, in one file.

Pre-LayerNorm decoder blocks, tied input/output embeddings, learned absolute positions and
a learned *role* embedding: the role of a token says which line it belongs to and which
character index it stands at, so the step that predicts 下联[i] knows it stands opposite
上联[i] (this helped alignment in the sizing run).

Roles (``role`` tensor)::

    0                      prefix tokens (BOS, style, register)
    1 + i                  上联 character i           (i in 0..MAX_LINE-1)
    1 + MAX_LINE + j       a token whose next prediction is 下联[j] (SEP predicts j=0;
                           下联[j-1] predicts j; j = n predicts EOS)

The forward pass takes per-sequence positions and an explicit attention mask, so a batch
may hold sequences of different lengths (right padding), and an optional slot-based KV
cache (``KVCache``) for incremental decoding:

* prefill: ``T`` new tokens for rows ``row0 .. row0+B`` of the cache; the mask is
  ``[B, T, S]`` (causal and key padding). With ``S == T`` the tokens are written at cache
  positions ``0 .. T-1``; with ``S > T`` the first ``S - T`` positions of those rows already
  hold a prefix (a shared prompt prefix copied in) and the tokens go after it.
* decode: one new token per row ``0 .. B-1``, written at ``cache_pos[b]``; the mask is
  ``[B, 1, S]`` over the first ``S`` cache positions.

``forward_groups`` runs several such groups in one pass - a decode step of the live rows
and the prefill of new ones: the tokens of every group go through each linear layer as one
``[N, D]`` matrix, and only attention runs per group (``Group``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MAX_LINE = 32


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    n_layer: int = 6
    n_head: int = 8
    d_model: int = 256
    d_ff: int = 1024
    block_size: int = 72  # 3 prefix + 32 + SEP + 32 + EOS = 69 tokens at most
    n_roles: int = 2 * MAX_LINE + 4
    dropout: float = 0.0  # training only: on the embeddings and each residual branch

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class KVCache:
    """Per-layer key/value tensors ``[rows, n_head, max_len, head_dim]`` for ``rows`` slots."""

    def __init__(self, cfg: ModelConfig, rows: int, device: torch.device, dtype: torch.dtype) -> None:
        hd = cfg.d_model // cfg.n_head
        shape = (cfg.n_layer, rows, cfg.n_head, cfg.block_size, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.rows = rows

    def move_row(self, src: int, dst: int, length: int | None = None) -> None:
        """Copy slot ``src`` into slot ``dst`` (used to keep live slots contiguous): its
        first ``length`` positions (all when None; the rest is never attended to)."""
        n = self.k.shape[3] if length is None else length
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]


@dataclass
class Group:
    """Rows of one forward pass whose attention is computed together: ``B`` sequences of
    ``T`` new tokens each (flattened into the pass's ``[N, D]`` tokens in this order).

    * no cache: plain attention over the ``T`` tokens (training);
    * ``cache_pos`` None: a prefill of cache rows ``row0 .. row0+B`` (module docstring);
    * ``cache_pos`` given: a decode step, one token per row ``row0 .. row0+B`` at its position.
    ``select`` (``[B]``) keeps one position a row from the last block on.
    """

    B: int
    T: int
    bias: Tensor  # [B, 1, T, S] additive mask: 0 may attend, -inf may not
    row0: int = 0
    cache_pos: Tensor | None = None  # [B] decode only
    flat_pos: Tensor | None = None  # [B * H] decode only (``decode_positions``)
    select: Tensor | None = None  # [B]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self, x: Tensor, groups: list[Group], layer: int, cache: KVCache | None, selected: bool
    ) -> Tensor:
        """``[N, D]`` tokens of all groups -> ``[N', D]`` (``N'``: the selected ones when
        ``selected``). The projections run over every group at once; attention per group."""
        D = x.shape[-1]
        qkv = self.qkv(x).float()  # [N, 3D]; attention and the cache are fp32 (under bf16 autocast too)
        ys: list[Tensor] = []
        at = 0
        for g in groups:
            n = g.B * g.T
            ys.append(self._attend(qkv[at : at + n].view(g.B, g.T, 3 * D), g, layer, cache, selected))
            at += n
        y = ys[0] if len(ys) == 1 else torch.cat(ys)
        return self.proj(y)  # type: ignore[no-any-return]

    def _attend(
        self, qkv: Tensor, g: Group, layer: int, cache: KVCache | None, selected: bool
    ) -> Tensor:
        """One group: ``qkv [B, T, 3D]`` -> ``[B * Q, D]`` (``Q``: T, or 1 when selected)."""
        B, T, D3 = qkv.shape
        D = D3 // 3
        q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]
        # [B, T, D] -> [B, H, T, hd]
        q = q.reshape(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.reshape(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.reshape(B, T, self.n_head, self.head_dim).transpose(1, 2)
        bias = g.bias
        if selected and g.select is not None:  # every key and value (the cache needs them), one query a row
            rows = torch.arange(B, device=qkv.device)
            q = q[rows, :, g.select][:, :, None]  # [B, H, 1, hd]
            bias = bias[rows, :, g.select][:, :, None]  # [B, 1, 1, S]
        if cache is not None:
            S = bias.shape[-1]
            ck, cv = cache.k[layer], cache.v[layer]  # [rows, H, max_len, hd]
            r0 = g.row0
            if g.cache_pos is None:  # prefill after the ``start`` positions already cached
                start = S - T
                ck[r0 : r0 + B, :, start:S] = k.to(ck.dtype)
                cv[r0 : r0 + B, :, start:S] = v.to(cv.dtype)
                if start:
                    k = ck[r0 : r0 + B, :, :S].to(q.dtype)
                    v = cv[r0 : r0 + B, :, :S].to(q.dtype)
            else:  # decode: one token per row at its own position
                flat_pos = g.flat_pos  # set with cache_pos (``forward_groups``)
                assert flat_pos is not None
                hd = self.head_dim  # one row copy per (row, head): cheaper than an index_put
                ck.view(-1, hd).index_copy_(0, flat_pos, k.reshape(B * self.n_head, hd).to(ck.dtype))
                cv.view(-1, hd).index_copy_(0, flat_pos, v.reshape(B * self.n_head, hd).to(cv.dtype))
                k = ck[r0 : r0 + B, :, :S].to(q.dtype)
                v = cv[r0 : r0 + B, :, :S].to(q.dtype)
        # Hand-written attention: on CPU it beat the fused kernel for training (backward).
        att = q @ k.transpose(-2, -1)  # [B, H, Q, S]
        att = F.softmax(att.mul_(1.0 / math.sqrt(self.head_dim)).add_(bias), dim=-1)
        y = att @ v  # [B, H, Q, hd]
        out: Tensor = y.transpose(1, 2).reshape(B * q.shape[2], D)
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(
        self, x: Tensor, groups: list[Group], layer: int, cache: KVCache | None, selected: bool
    ) -> Tensor:
        """``[N, D]`` -> ``[N', D]``: with ``selected``, only the positions ``select`` of the
        groups that have one (keys and values of every position still reach the cache)."""
        h = self.ln1(x)
        if selected and any(g.select is not None for g in groups):
            x = _selected_rows(x, groups)
        x = x + _dropout(self.attn(h, groups, layer, cache, selected), self.dropout, self.training)
        return x + _dropout(self.out(F.gelu(self.fc(self.ln2(x)))), self.dropout, self.training)


def _dropout(t: Tensor, p: float, training: bool) -> Tensor:
    # checked here, not an nn.Dropout: inference pays no call for it
    return F.dropout(t, p, True) if training and p else t


def _selected_rows(x: Tensor, groups: list[Group]) -> Tensor:
    """The tokens ``[N, D]`` reduced to each group's ``select`` positions (``[N', D]``)."""
    parts: list[Tensor] = []
    at = 0
    for g in groups:
        n = g.B * g.T
        part = x[at : at + n]
        if g.select is not None:
            flat = torch.arange(g.B, device=x.device) * g.T + g.select
            part = part.index_select(0, flat)
        parts.append(part)
        at += n
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class GroupInput:
    """One group's tokens for ``CoupletTransformer.forward_groups``: ``idx``, ``pos``,
    ``role`` ``[B, T]`` and ``mask`` ``[B, T, S]`` (bool, True = may attend)."""

    idx: Tensor
    pos: Tensor
    role: Tensor
    mask: Tensor
    row0: int = 0
    cache_pos: Tensor | None = None  # [B] decode
    select: Tensor | None = None  # [B]


class CoupletTransformer(nn.Module):
    """The couplet language model; see the module docstring for roles and the cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.role_emb = nn.Embedding(cfg.n_roles, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        # None: the tied embedding as the output layer; inference may set a faster
        # equivalent (``model.onednn``), never part of the state dict
        self.lm_head: nn.Module | None = None
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("attn.proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: Tensor,  # [B, T] token ids
        pos: Tensor,  # [B, T] absolute positions
        role: Tensor,  # [B, T] roles (module docstring)
        mask: Tensor | None = None,  # [B, T, S] bool; None = causal over T (training)
        cache: KVCache | None = None,
        row0: int = 0,
        cache_pos: Tensor | None = None,  # [B] decode positions
        select: Tensor | None = None,  # [B] the one position per row whose logits are wanted
        last: int | None = None,  # logits of each row's last ``last`` positions only
    ) -> Tensor:
        """Logits ``[B, T, vocab]``, ``[B, vocab]`` at positions ``select`` when given, or
        ``[B, last, vocab]`` with ``last`` (the LM head is most of a scoring pass's work)."""
        B, T = idx.shape
        if last is not None and (select is not None or not 0 < last <= T):
            raise ValueError(f"last must be in 1..{T} and not given with select, got {last}")
        if mask is None:
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            mask = causal.expand(B, T, T)
        h = self.hidden_groups([GroupInput(idx, pos, role, mask, row0, cache_pos, select)], cache)
        if select is not None:
            return self.head(h)
        if last is not None:
            return self.head(h.view(B, T, -1)[:, T - last :].reshape(B * last, -1)).view(B, last, -1)
        return self.head(h).view(B, T, -1)

    def head(self, h: Tensor) -> Tensor:
        """Final LayerNorm and the LM head: hidden ``[N, D]`` -> logits ``[N, vocab]``."""
        x = self.ln_f(h)
        if self.lm_head is not None:
            return self.lm_head(x)  # type: ignore[no-any-return]
        return F.linear(x, self.tok_emb.weight)  # tied embeddings

    def forward_groups(self, inputs: list[GroupInput], cache: KVCache | None = None) -> Tensor:
        """One pass over several groups of rows - say a decode step of the live rows and the
        prefill of new ones - whose linear layers run over all their tokens at once (one
        matrix product instead of one per group), attention per group. Logits ``[N', vocab]``:
        every token of each group in order, or its ``select`` positions only."""
        return self.head(self.hidden_groups(inputs, cache))

    def hidden_groups(self, inputs: list[GroupInput], cache: KVCache | None = None) -> Tensor:
        """``forward_groups`` before the final LayerNorm and the head: ``[N', D]``."""
        groups: list[Group] = []
        xs: list[Tensor] = []
        for gi in inputs:
            B, T = gi.idx.shape
            x = self.tok_emb(gi.idx) + self.pos_emb(gi.pos) + self.role_emb(gi.role)  # [B, T, D]
            x = _dropout(x, self.cfg.dropout, self.training)
            xs.append(x.view(B * T, -1))
            # the mask as an additive bias, built once for every layer: [B, 1, T, S]
            bias = torch.zeros(gi.mask.shape, dtype=x.dtype, device=x.device)
            bias = bias.masked_fill_(~gi.mask, float("-inf"))[:, None]
            flat_pos = None
            if cache is not None and gi.cache_pos is not None:
                flat_pos = decode_positions(gi.cache_pos, self.cfg.n_head, cache.k.shape[3], gi.row0)
            groups.append(Group(B, T, bias, gi.row0, gi.cache_pos, flat_pos, gi.select))
        x = xs[0] if len(xs) == 1 else torch.cat(xs)  # [N, D]
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            # the last block computes only the wanted positions: its outputs elsewhere feed
            # nothing (a prefill wants one position a row; about 1/8 of its work saved)
            x = block(x, groups, i, cache, i == last)
        return x  # type: ignore[no-any-return]


def decode_positions(cache_pos: Tensor, n_head: int, max_len: int, row0: int = 0) -> Tensor:
    """Row indices ``[B * H]`` into a layer's cache viewed as ``[rows * H * max_len, hd]``
    for a decode step's new keys and values: row ``row0 + b``, head ``h``, position
    ``cache_pos[b]``."""
    B = cache_pos.shape[0]
    heads = torch.arange(n_head, device=cache_pos.device)
    rows = torch.arange(row0, row0 + B, device=cache_pos.device)[:, None]
    return ((rows * n_head + heads) * max_len + cache_pos[:, None]).reshape(-1)
