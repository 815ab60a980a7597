"""What the engine core takes and gives, and what it needs of a model runner (plain types:
``engine.core`` is their one user besides its clients and tests)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from chunlian.engine.request import BeamHyp, SeqOutput, SeqSpec
from chunlian.errors import ChunlianError
from chunlian.types import CoupletRequest, CoupletResult

__all__ = ["CoreOutput", "CoreRequest", "Runner"]


class Runner(Protocol):
    """What the core needs of a model runner (``ModelRunner`` or a fake in tests)."""

    capacity: int
    tokens_emitted: int
    padded_batches: bool  # set for static batching: one padded rectangle per batch
    @property
    def n_live(self) -> int: ...  # rows live

    # decode the live rows and admit ``specs`` (either may be empty): one iteration
    def step(self, specs: list[SeqSpec]) -> list[SeqOutput]: ...
    def release(self, seq_ids: set[int] | list[int]) -> None: ...
    def bind_thread(self) -> None: ...  # called on the stepping thread before its first step


@dataclass(frozen=True)
class CoreRequest:
    """A request as the core takes it: its id (unique among the core's live requests) and
    its absolute deadline on ``time.monotonic`` (``math.inf``: none)."""

    req_id: int
    request: CoupletRequest
    deadline_s: float = math.inf


@dataclass(frozen=True)
class CoreOutput:
    """How a request ended: exactly one of ``result`` and ``error``; a beam request's result
    comes with its search's final lines, best first by the beam's own score (``beams``:
    for sweeps and distillation, which rerank them their own way)."""

    req_id: int
    result: CoupletResult | None = None
    error: ChunlianError | None = None
    beams: tuple[BeamHyp, ...] = ()
