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

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class KVCache:
    """Per-layer key/value tensors ``[rows, n_head, max_len, head_dim]`` for ``rows`` slots."""

    def __init__(self, cfg: ModelConfig, rows: int, device: torch.device, dtype: torch.dtype) -> None:
        hd = cfg.d_model // cfg.n_head
        shape = (cfg.n_layer, rows, cfg.n_head, cfg.block_size, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.rows = rows

    def move_row(self, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst`` (used to keep live slots contiguous)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self,
        x: Tensor,  # [B, T, D]
        mask: Tensor,  # [B, T, S] bool, True = may attend
        layer: int,
        cache: KVCache | None,
        row0: int,
        cache_pos: Tensor | None,  # [B] long, decode only
        select: Tensor | None = None,  # [B]: queries at these positions only (mask [B, 1, S])
    ) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        # [B, T, D] -> [B, H, T, hd]
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if select is not None:  # every key and value (the cache needs them), one query a row
            q = q[torch.arange(B, device=x.device), :, select][:, :, None]  # [B, H, 1, hd]
        if cache is not None:
            S = mask.shape[-1]
            ck, cv = cache.k[layer], cache.v[layer]  # [rows, H, max_len, hd]
            if cache_pos is None:  # prefill after the ``start`` positions already cached
                start = S - T
                ck[row0 : row0 + B, :, start:S] = k.to(ck.dtype)
                cv[row0 : row0 + B, :, start:S] = v.to(cv.dtype)
                if start:
                    k = ck[row0 : row0 + B, :, :S].to(q.dtype)
                    v = cv[row0 : row0 + B, :, :S].to(q.dtype)
            else:  # decode: one token per row at its own position
                rows = torch.arange(B, device=x.device)
                ck[rows, :, cache_pos] = k[:, :, 0].to(ck.dtype)
                cv[rows, :, cache_pos] = v[:, :, 0].to(cv.dtype)
                k = ck[:B, :, :S].to(q.dtype)
                v = cv[:B, :, :S].to(q.dtype)
        # Hand-written attention: on CPU it beat the fused kernel for training (backward).
        # Q = q's queries: T, or 1 with ``select``
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # [B, H, Q, S]
        att = att.masked_fill(~mask[:, None], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # [B, H, Q, hd]
        y = y.transpose(1, 2).contiguous().view(B, q.shape[2], D)
        return self.proj(y)  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(
        self, x: Tensor, mask: Tensor, layer: int, cache: KVCache | None, row0: int,
        cache_pos: Tensor | None, select: Tensor | None = None,
    ) -> Tensor:
        """``[B, T, D]``, or ``[B, 1, D]`` at positions ``select`` (keys and values of every
        position still reach the cache)."""
        h = self.ln1(x)
        if select is not None:
            rows = torch.arange(x.shape[0], device=x.device)
            x, mask = x[rows, select][:, None], mask[rows, select][:, None]  # [B, 1, D], [B, 1, S]
        x = x + self.attn(h, mask, layer, cache, row0, cache_pos, select)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))  # type: ignore[no-any-return]


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
    ) -> Tensor:
        """Logits ``[B, T, vocab]``, or ``[B, vocab]`` at positions ``select`` when given."""
        B, T = idx.shape
        if mask is None:
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            mask = causal.expand(B, T, T)
        x = self.tok_emb(idx) + self.pos_emb(pos) + self.role_emb(role)  # [B, T, D]
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            # the last block computes only the wanted positions: its outputs elsewhere feed
            # nothing (a prefill wants one position a row; about 1/8 of its work saved)
            x = block(x, mask, i, cache, row0, cache_pos, select if i == last else None)
        if select is not None:
            x = x[:, 0]  # [B, D]
        x = self.ln_f(x)
        return F.linear(x, self.tok_emb.weight)  # tied embeddings: [B, (T,) vocab]
