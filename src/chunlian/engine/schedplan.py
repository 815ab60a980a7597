"""The scheduler's plain data: a request as it sees it, its plan for a step, its
configuration and the refusals of ``Scheduler.add`` (``engine.scheduler`` has the rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from chunlian.config import EngineSettings
from chunlian.engine.tiers import SEARCH_OF, StepDown
from chunlian.types import BatchingMode, Priority, Served

KNOBS = EngineSettings.defaults()  # the engine knobs' defaults


@dataclass
class SchedRequest:
    """The scheduler's view of one request."""

    req_id: int
    priority: Priority
    n_seqs: int
    arrival_s: float
    deadline_s: float
    cancelled: bool = False
    remaining: int = 0  # sequences not yet finished, once admitted
    tier: Served | None = "fast"  # the mode that answers it; None: chosen at admission (auto)
    admitted_s: float = 0.0

    def rows_as(self, tier: Served) -> int:
        """Rows it holds when ``tier`` answers it."""
        params = SEARCH_OF.get(tier)
        return params.width if params is not None else self.n_seqs


@dataclass
class StepPlan:
    """What the engine does next. ``idle_wait_s`` is set only when there is nothing to run."""

    prefill: list[int] = field(default_factory=list)  # request ids to admit now
    decode: bool = False  # run one decode step over the live sequences
    expired: list[int] = field(default_factory=list)  # waiting, deadline passed: fail, never run
    cancelled: list[int] = field(default_factory=list)  # waiting, cancelled: fail, never run
    release: list[int] = field(default_factory=list)  # running, cancelled or past deadline
    tiers: dict[int, Served] = field(default_factory=dict)  # modes chosen for admitted auto requests
    idle_wait_s: float | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine knobs the scheduler reads; their defaults and bounds are ``EngineSettings``'."""

    max_batch_size: int = KNOBS.max_batch_size  # the engine passes its config's
    max_wait_ms: float = KNOBS.max_wait_ms
    max_queue_size: int = KNOBS.max_queue_size
    batching: BatchingMode = KNOBS.batching
    bulk_min_share: float = KNOBS.bulk_min_share
    min_prefill_seqs: int = KNOBS.min_prefill_seqs  # 0 = auto: max(1, max_batch_size // 8)
    beam_rows: int = KNOBS.beam_rows  # rows of the searches' own pool (the core passes 0 without one)
    step_down: StepDown = field(default_factory=StepDown)

    @property
    def prefill_group(self) -> int:
        auto = max(1, self.max_batch_size // 8)
        return min(self.max_batch_size, self.min_prefill_seqs or auto)

    def __post_init__(self) -> None:
        if self.beam_rows < 0:
            raise ValueError(f"beam_rows must be >= 0, got {self.beam_rows}")
        EngineSettings.check(
            max_batch_size=self.max_batch_size, max_wait_ms=self.max_wait_ms,
            max_queue_size=self.max_queue_size, batching=self.batching,
            bulk_min_share=self.bulk_min_share, min_prefill_seqs=self.min_prefill_seqs,
        )


def bulk_rows(rows: int, share: float) -> int:
    """Rows of ``rows`` that bulk work may hold while interactive work runs or waits:
    ``share`` of them, at least one (none when ``share`` is 0). The scheduler reserves them
    for waiting bulk work and holds bulk to them beside interactive work."""
    return max(1, math.floor(rows * share)) if share > 0 else 0


class QueueFull(Exception):
    """Raised by ``add`` when the waiting queue holds ``max_queue_size`` requests."""


class Unreachable(Exception):
    """Raised by ``add`` for a search that, on the measured service times, cannot end
    before its deadline; ``wait_s``: when it could start, as estimated."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"a search could start in about {wait_s:.1f} s")
        self.wait_s = wait_s


class Hopeless(Exception):
    """Raised by ``add`` for a search whose mode, at its measured service time, takes longer
    than the request's whole timeout: no wait and no retry can help."""

    def __init__(self, tier: str, took_s: float, timeout_s: float) -> None:
        super().__init__(f"the {tier} mode takes about {took_s:.1f} s here, more than the "
                         f"request's timeout of {timeout_s:.1f} s")
        self.took_s = took_s
