"""What an engine reports about itself: ``EngineStats``, the counters the metrics read at
scrape time, and ``StepReport``, what a step listener hears after each model step."""

from __future__ import annotations

from dataclasses import dataclass

from chunlian.errors import Cancelled, ChunlianError, DeadlineExceeded


@dataclass
class EngineStats:
    """Plain counters, read by the metrics collector at scrape time."""

    queue_depth: int = 0
    running: int = 0
    max_queue_size: int = 0
    completed: int = 0
    failed: int = 0
    deadline_drops: int = 0
    rejected: int = 0
    coalesced: int = 0
    cancelled: int = 0
    tokens_total: int = 0
    steps_total: int = 0
    prefill_total: int = 0

    def count_end(self, error: ChunlianError | None) -> None:
        """Count a request that ended with ``error`` (None: a result)."""
        if error is None:
            self.completed += 1
        elif isinstance(error, Cancelled):
            self.cancelled += 1
        else:
            self.failed += 1
            self.deadline_drops += isinstance(error, DeadlineExceeded)


@dataclass(frozen=True)
class StepReport:
    batch_size: int
    step_s: float
    tokens: int
