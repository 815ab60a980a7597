"""What an engine reports about itself: ``EngineStats``, the counters the metrics read at
scrape time, and ``StepReport``, what a step listener hears after each model step."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class StepReport:
    batch_size: int
    step_s: float
    tokens: int
