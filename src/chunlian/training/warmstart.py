"""Start a model from trained weights with a new vocabulary and, optionally, more layers.

A rebuilt vocabulary keeps the trained embedding row of every character both vocabularies
share (the input and output embeddings are tied, so the output side follows); new characters
start from a fresh row. Layers added on top of the trained ones start with zero output
projections, so each added block is the identity on the residual stream: the grown model
computes exactly what the trained one did until training moves it.
"""

from __future__ import annotations

import torch

from chunlian.model.tokenizer import Tokenizer
from chunlian.model.transformer import Block, CoupletTransformer, ModelConfig


def grown(
    old: CoupletTransformer, old_tok: Tokenizer, new_tok: Tokenizer, n_layer: int, dropout: float
) -> CoupletTransformer:
    """A ``n_layer``-layer model over ``new_tok`` holding ``old``'s trained weights."""
    oc = old.cfg
    if n_layer < oc.n_layer:
        raise ValueError(f"a warm start cannot drop layers ({oc.n_layer} -> {n_layer})")
    cfg = ModelConfig(len(new_tok), n_layer, oc.n_head, oc.d_model, oc.d_ff, dropout=dropout)
    model = CoupletTransformer(cfg)
    old_state = old.state_dict()
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name == "tok_emb.weight" or name not in old_state:
                continue
            if p.shape != old_state[name].shape:
                raise ValueError(f"{name}: {tuple(old_state[name].shape)} cannot grow into {tuple(p.shape)}")
            p.copy_(old_state[name])
        emb = model.tok_emb.weight
        for i, t in enumerate(new_tok.itos):
            j = old_tok.stoi.get(t)
            if j is not None:
                emb[i].copy_(old.tok_emb.weight[j])
        for block in list(model.blocks)[oc.n_layer:]:
            assert isinstance(block, Block)
            for lin in (block.attn.proj, block.out):
                lin.weight.zero_()
                lin.bias.zero_()
    return model
