"""The batch scheduler: plain Python, no torch, no I/O, no clock of its own.

It is handed the time (``now_s``) and returns the next step's plan as a dataclass; it is
then told which sequences finished. Units are requests (admitted whole: a request with
``n`` candidates needs ``n`` free slots) and sequences (one KV-cache slot each).

Admission rules
  * Slots: at most ``max_batch_size`` live sequences.
  * Max wait: when nothing is running, the first waiting request waits at most
    ``max_wait_ms`` for companions; a full batch's worth of waiting sequences starts at once.
  * Continuous mode: waiting requests join the running batch at the next step; finished
    sequences leave at once. Static mode: nothing joins until the running batch is empty.
  * Prefill grouping (continuous mode, a batch running): newcomers join once
    ``min_prefill_seqs`` of them fit in the free slots together, or all that wait do. A
    prefill is a forward pass of its own; admitting one sequence per step would pay it at
    every step (on this CPU a small forward costs about as much as a full decode step).
    A newcomer waits at most a few decode steps for this.
  * Deadlines count queue time: a waiting request whose deadline passed is dropped before it
    reaches the model (``expired``); a running one is released (``release``).
  * Cancellation: a cancelled waiting request is dropped; a running one frees its slots.
  * Priorities: interactive first, FIFO within a class. Whenever bulk work waits it may hold
    up to ``bulk_min_share`` of the slots (at least one) even while interactive work waits,
    so bulk is never starved for ever. While interactive work runs or waits, bulk holds no
    more than that share: every row in a step shares its cost, so bulk rows slow interactive
    answers even when slots are free. With no interactive work, bulk fills every slot. This
    is the one place the bulk share is enforced: job runners send bulk work at ``bulk``
    priority and leave the pacing to the scheduler.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from chunlian.config import EngineSettings
from chunlian.types import BatchingMode, Priority

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


@dataclass
class StepPlan:
    """What the engine does next. ``idle_wait_s`` is set only when there is nothing to run."""

    prefill: list[int] = field(default_factory=list)  # request ids to admit now
    decode: bool = False  # run one decode step over the live sequences
    expired: list[int] = field(default_factory=list)  # waiting, deadline passed: fail, never run
    cancelled: list[int] = field(default_factory=list)  # waiting, cancelled: fail, never run
    release: list[int] = field(default_factory=list)  # running, cancelled or past deadline
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

    @property
    def prefill_group(self) -> int:
        auto = max(1, self.max_batch_size // 8)
        return min(self.max_batch_size, self.min_prefill_seqs or auto)

    def __post_init__(self) -> None:
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


class Scheduler:
    """Decides admission, batching and dropping; see the module docstring for the rules."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: dict[Priority, deque[SchedRequest]] = {"interactive": deque(), "bulk": deque()}
        self.running: dict[int, SchedRequest] = {}
        self.live_seqs = 0
        self.live_bulk_seqs = 0
        self._by_id: dict[int, SchedRequest] = {}

    # ---- inputs --------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self.waiting["interactive"]) + len(self.waiting["bulk"])

    def add(self, req: SchedRequest) -> None:
        """Queue a request; raises ``QueueFull`` past ``max_queue_size``."""
        if req.n_seqs > self.cfg.max_batch_size:
            raise ValueError(f"request needs {req.n_seqs} slots, max_batch_size is {self.cfg.max_batch_size}")
        if self.queue_depth >= self.cfg.max_queue_size:
            raise QueueFull()
        self.waiting[req.priority].append(req)
        self._by_id[req.req_id] = req

    def cancel(self, req_id: int) -> None:
        """Mark a request cancelled; it leaves at the next plan. Unknown ids are ignored."""
        r = self._by_id.get(req_id)
        if r is not None:
            r.cancelled = True

    def on_seqs_finished(self, req_id: int, count: int) -> bool:
        """Record finished sequences of a running request; True when the request is done."""
        r = self.running.get(req_id)
        if r is None:
            return False
        r.remaining -= count
        self._free(r, count)
        if r.remaining <= 0:
            del self.running[req_id]
            self._by_id.pop(req_id, None)
            return True
        return False

    def fail_running(self, req_id: int) -> None:
        """Forget a running request whose sequences were released (error, cancel, deadline)."""
        r = self.running.pop(req_id, None)
        if r is not None:
            self._free(r, r.remaining)
            r.remaining = 0
            self._by_id.pop(req_id, None)

    def reset(self) -> None:
        """Forget every request, waiting or running (the core failed them all)."""
        for q in self.waiting.values():
            q.clear()
        self.running.clear()
        self._by_id.clear()
        self.live_seqs = self.live_bulk_seqs = 0

    def _free(self, r: SchedRequest, count: int) -> None:
        self.live_seqs -= count
        if r.priority == "bulk":
            self.live_bulk_seqs -= count

    # ---- the plan --------------------------------------------------------------------------
    def plan(self, now_s: float) -> StepPlan:
        plan = StepPlan()
        for q in self.waiting.values():
            kept: deque[SchedRequest] = deque()
            for r in q:
                if r.cancelled:
                    plan.cancelled.append(r.req_id)
                elif r.deadline_s <= now_s:
                    plan.expired.append(r.req_id)
                else:
                    kept.append(r)
                    continue
                self._by_id.pop(r.req_id, None)
            q.clear()
            q.extend(kept)
        for r in list(self.running.values()):
            if r.cancelled or r.deadline_s <= now_s:
                plan.release.append(r.req_id)
                self.fail_running(r.req_id)
        self._admit(plan, now_s)
        plan.decode = self.live_seqs > len_of(plan.prefill, self._by_id)
        if not plan.has_work and self.queue_depth:
            first = min(q[0].arrival_s for q in self.waiting.values() if q)
            plan.idle_wait_s = max(0.0, first + self.cfg.max_wait_ms / 1000.0 - now_s)
        return plan

    def _admit(self, plan: StepPlan, now_s: float) -> None:
        cap = self.cfg.max_batch_size
        if self.cfg.batching == "static" and self.live_seqs > 0:
            return
        if not self.queue_depth:
            return
        if self.live_seqs == 0:
            first = min(q[0].arrival_s for q in self.waiting.values() if q)
            if self._waiting_seqs(cap) < cap and now_s < first + self.cfg.max_wait_ms / 1000.0:
                return  # idle: give the first request up to max_wait_ms to gather companions
        else:
            group = self.cfg.prefill_group
            if cap - self.live_seqs < self._waiting_seqs(group):
                return  # running: let newcomers join in groups (prefill grouping, docstring)
        bulk_q, inter_q = self.waiting["bulk"], self.waiting["interactive"]
        share = bulk_rows(cap, self.cfg.bulk_min_share)
        reserve = max(0, share - self.live_bulk_seqs) if bulk_q else 0
        self._take(inter_q, cap - self.live_seqs - reserve, plan)
        bulk_room = cap - self.live_seqs
        if inter_q or self.live_seqs > self.live_bulk_seqs:  # interactive work: bulk keeps to its share
            bulk_room = min(bulk_room, share - self.live_bulk_seqs)
        self._take(bulk_q, bulk_room, plan)

    def _waiting_seqs(self, limit: int) -> int:
        """Sequences waiting, counted up to ``limit`` (each step asks; the queue can be long)."""
        n = 0
        for q in self.waiting.values():
            for r in q:
                n += r.n_seqs
                if n >= limit:
                    return limit
        return n

    def _take(self, q: deque[SchedRequest], room: int, plan: StepPlan) -> None:
        while q and q[0].n_seqs <= room:
            r = q.popleft()
            r.remaining = r.n_seqs
            self.running[r.req_id] = r
            self.live_seqs += r.n_seqs
            if r.priority == "bulk":
                self.live_bulk_seqs += r.n_seqs
            room -= r.n_seqs
            plan.prefill.append(r.req_id)


def len_of(req_ids: list[int], by_id: dict[int, SchedRequest]) -> int:
    """Sequences belonging to the requests being admitted in this plan."""
    return sum(by_id[i].n_seqs for i in req_ids if i in by_id)
