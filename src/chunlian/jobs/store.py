"""Job state and per-item results: the interface, and the in-memory store (embedded mode).

Both stores (this one and ``jobs.redis_store.RedisJobStore`` for Celery mode) have the same
interface. The rule that makes redelivery safe: **the first result written for a (job,
item) wins**, and the counters move only when a result is written. A task that runs again
after its worker was killed, or an item that finishes after the job was cancelled, can
therefore never count an item twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chunlian.jobs.items import CANCELLED, CANCELLED_ENTRY, DONE, FAILED, OUTCOMES, PENDING, Entry

MAX_RESULTS_PAGE = 1000


@dataclass(frozen=True)
class JobState:
    """A job's counters and flags; ``status`` is derived from them."""

    job_id: str
    total: int
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    cancel_requested: bool = False
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.done + self.failed + self.cancelled >= self.total

    @property
    def status(self) -> str:
        """queued | running | done | failed | cancelled.

        ``cancelled``: DELETE came before the job finished. ``done``: every item has a
        result and at least one succeeded (failed items carry their error). ``failed``:
        every item failed.
        """
        if self.cancel_requested:
            return "cancelled"
        if self.finished:
            return "done" if self.done > 0 else "failed"
        if self.started_at is not None or self.done or self.failed:
            return "running"
        return "queued"

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "progress": {"done": self.done, "failed": self.failed, "cancelled": self.cancelled,
                         "total": self.total},
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class JobStore(Protocol):
    """What the API, the in-process runner and the Celery tasks need of a store."""

    def create(self, job_id: str, total: int) -> None:
        """A new job of ``total`` items, all pending."""
        ...

    def record(self, job_id: str, results: Sequence[tuple[int, Entry]]) -> int:
        """Write each (index, entry) unless the item has a result already (first write
        wins); returns how many were written. Unknown (or expired) job: writes nothing."""
        ...

    def missing(self, job_id: str, indices: Iterable[int]) -> list[int]:
        """Those of ``indices`` that have no result yet, in the given order."""
        ...

    def begin_attempt(self, job_id: str, indices: Sequence[int]) -> dict[int, int]:
        """Count one more try for each item (and mark the job started); the new counts."""
        ...

    def tries(self, job_id: str, indices: Sequence[int] | None = None) -> dict[int, int]:
        """Tries so far per item (of ``indices``, or of every item tried)."""
        ...

    def is_cancelled(self, job_id: str) -> bool:
        ...

    def cancel(self, job_id: str) -> JobState | None:
        """Mark the job cancelled and every item without a result ``cancelled`` (unless the
        job has finished: then nothing changes). None: no such job."""
        ...

    def state(self, job_id: str) -> JobState | None:
        ...

    def results(self, job_id: str, offset: int, limit: int) -> list[Entry]:
        """Entries for items ``offset .. offset+limit-1`` (``index`` added; ``pending`` for
        items without a result)."""
        ...

    def recent(self, limit: int) -> list[JobState]:
        """The ``limit`` newest jobs still held (created within the TTL), newest first."""
        ...

    def close(self) -> None:
        ...


def outcome_of(entry: Entry) -> str:
    """The outcome counter a result entry moves (its ``status``), checked."""
    status = entry.get("status")
    if status not in OUTCOMES:
        raise ValueError(f"a result entry needs a status in {OUTCOMES}, got {status!r}")
    return str(status)


def page_range(total: int, offset: int, limit: int) -> range:
    """Item indices of one results page, clipped to the job and to ``MAX_RESULTS_PAGE``."""
    return range(max(0, offset), min(total, max(0, offset) + max(0, min(limit, MAX_RESULTS_PAGE))))


# ---- in memory ------------------------------------------------------------------------------
@dataclass
class _MemJob:
    total: int
    created_at: float
    results: dict[int, Entry] = field(default_factory=dict)
    tries: dict[int, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    cancel_requested: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    touched: float = 0.0


class MemoryJobStore:
    """The embedded store: one process, a lock, expiry checked on access."""

    def __init__(self, ttl_s: float, clock: Any = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._jobs: dict[str, _MemJob] = {}
        self._lock = threading.Lock()

    def _get(self, job_id: str) -> _MemJob | None:
        job = self._jobs.get(job_id)
        if job is not None and self._clock() - job.touched > self.ttl_s:
            del self._jobs[job_id]
            return None
        return job

    def _purge(self) -> None:
        now = self._clock()
        for jid in [j for j, job in self._jobs.items() if now - job.touched > self.ttl_s]:
            del self._jobs[jid]

    def create(self, job_id: str, total: int) -> None:
        now = self._clock()
        with self._lock:
            self._purge()
            self._jobs[job_id] = _MemJob(total=total, created_at=now, touched=now)

    def record(self, job_id: str, results: Sequence[tuple[int, Entry]]) -> int:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return 0
            written = 0
            for index, entry in results:
                outcome = outcome_of(entry)
                if index in job.results or not 0 <= index < job.total:
                    continue
                job.results[index] = entry
                job.counts[outcome] += 1
                written += 1
            job.touched = self._clock()
            if written and job.finished_at is None and len(job.results) >= job.total:
                job.finished_at = job.touched
            return written

    def missing(self, job_id: str, indices: Iterable[int]) -> list[int]:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return []
            return [i for i in indices if i not in job.results]

    def begin_attempt(self, job_id: str, indices: Sequence[int]) -> dict[int, int]:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return {}
            for i in indices:
                job.tries[i] = job.tries.get(i, 0) + 1
            job.touched = self._clock()
            if job.started_at is None:
                job.started_at = job.touched
            return {i: job.tries[i] for i in indices}

    def tries(self, job_id: str, indices: Sequence[int] | None = None) -> dict[int, int]:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return {}
            if indices is None:
                return dict(job.tries)
            return {i: job.tries[i] for i in indices if i in job.tries}

    def is_cancelled(self, job_id: str) -> bool:
        with self._lock:
            job = self._get(job_id)
            return job is not None and job.cancel_requested

    def cancel(self, job_id: str) -> JobState | None:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return None
            if job.finished_at is None:
                job.cancel_requested = True
                for i in range(job.total):
                    if i not in job.results:
                        job.results[i] = CANCELLED_ENTRY
                        job.counts[CANCELLED] += 1
                job.touched = job.finished_at = self._clock()
            return self._state(job_id, job)

    def state(self, job_id: str) -> JobState | None:
        with self._lock:
            job = self._get(job_id)
            return None if job is None else self._state(job_id, job)

    @staticmethod
    def _state(job_id: str, job: _MemJob) -> JobState:
        return JobState(
            job_id, job.total, job.counts[DONE], job.counts[FAILED], job.counts[CANCELLED],
            job.cancel_requested, job.created_at, job.started_at, job.finished_at,
        )

    def recent(self, limit: int) -> list[JobState]:
        with self._lock:
            self._purge()
            newest = list(self._jobs.items())[::-1][:limit]  # the dict keeps creation order
            return [self._state(job_id, job) for job_id, job in newest]

    def results(self, job_id: str, offset: int, limit: int) -> list[Entry]:
        with self._lock:
            job = self._get(job_id)
            if job is None:
                return []
            return [{"index": i, **job.results.get(i, {"status": PENDING})}
                    for i in page_range(job.total, offset, limit)]

    def close(self) -> None:
        pass
