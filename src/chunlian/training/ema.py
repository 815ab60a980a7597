"""An exponential moving average of a model's weights, kept beside training."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


class EmaWeights:
    """An exponential moving average of a model's parameters (fp32, on the model's device):
    ``ema = decay * ema + (1 - decay) * param`` after each optimiser step. Buffers are not
    averaged (the model has none that learn)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.model, self.decay = model, decay
        self.shadow = {n: p.detach().clone().float() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in self.model.named_parameters():
            self.shadow[n].lerp_(p.detach().float(), 1.0 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        return self.shadow

    def load_state_dict(self, shadow: dict[str, Tensor]) -> None:
        self.shadow = {n: t.to(self.shadow[n].device) for n, t in shadow.items()}

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the model for the block (evaluate, export), then back."""
        saved = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.shadow[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.model.named_parameters():
                    p.copy_(saved[n])
