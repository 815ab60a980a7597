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
    reaches the model (``expired``); a running one is released (``release``) once
    ``RUNNING_GRACE_S`` more have passed, so an answer nearly done is finished and cached.
  * Cancellation: a cancelled waiting request is dropped; a running one frees its slots.
  * Priorities: interactive first, FIFO within a class. Whenever bulk work waits it may hold
    up to ``bulk_min_share`` of the slots (at least one) even while interactive work waits,
    so bulk is never starved for ever. While interactive work runs or waits, bulk holds no
    more than that share: every row in a step shares its cost, so bulk rows slow interactive
    answers even when slots are free. With no interactive work, bulk fills every slot. This
    is the one place the bulk share is enforced: job runners send bulk work at ``bulk``
    priority and leave the pacing to the scheduler. The head of the interactive queue is
    never kept out by that share: bulk holds no more than leaves it room, so it waits at
    most for the rows running when it became the head, whatever the pool's size.
  * An engine with nothing it can run sleeps until something can change: the first waiting
    request's max wait, else the first waiting deadline (new requests wake it).
  * Searches (``engine.tiers``: the best and good modes): with ``beam_rows`` > 0 their rows
    are a pool of their own (the reverse-trained weights' runner), so a search waiting for
    rows never holds up greedy requests behind it, nor they it. Bulk searches keep to the
    bulk share of that pool (at least one search) while interactive work runs or waits. A
    bulk search that waited for that pool a quarter of its timeout (at most 5 s) while
    interactive searches hold or wait for it is written greedily in the main pool, where bulk
    has its floor; a bulk search is never refused as unreachable.
  * Quality ``auto``: its mode is chosen when it is admitted (``StepDown.choose``), from the
    measured queue wait of interactive requests against its deadline and the free search
    rows. A ``best`` request whose deadline the measured service times say cannot be met
    is refused at once (``Unreachable``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from chunlian.engine.schedplan import (
    Hopeless,
    QueueFull,
    SchedRequest,
    SchedulerConfig,
    StepPlan,
    Unreachable,
    bulk_rows,
)
from chunlian.engine.tiers import SEARCH_OF
from chunlian.types import Priority, Served

__all__ = ["Hopeless", "QueueFull", "SchedRequest", "Scheduler", "SchedulerConfig", "StepPlan",
           "Unreachable", "bulk_rows"]

EWMA_WEIGHT = 0.2  # weight of the newest sample in the measured waits and service times
# a bulk search waits for search rows at most this share of its timeout, and at most this
# long, before it is written greedily (``Scheduler._overdue``)
BULK_SEARCH_WAIT_SHARE = 0.25
BULK_SEARCH_MAX_WAIT_S = 5.0
# a running request is released this long after its deadline: its caller has had its 504,
# and an answer finished meanwhile is cached for the retry (``api.service``); a request still
# waiting is dropped at its deadline
RUNNING_GRACE_S = 0.5


class Scheduler:
    """Decides admission, batching, modes and dropping; the module docstring has the rules."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: dict[Priority, deque[SchedRequest]] = {"interactive": deque(), "bulk": deque()}
        self.running: dict[int, SchedRequest] = {}
        self.live_seqs = 0  # rows held in the main pool (every row, without a search pool)
        self.live_bulk_seqs = 0
        self.live_search_rows = 0  # rows held in the search pool
        self.live_bulk_search_rows = 0
        # measured: interactive requests' queue wait, and each mode's time from admission to end
        self.wait_s = 0.0
        self.service_s: dict[str, float] = {}
        self._backlog = False  # set by each plan: more rows waiting than the main pool has free
        self._by_id: dict[int, SchedRequest] = {}
        # when a plan scans the queue (``_queue_changed``): cancellations, a heap of deadlines
        self._cancelled_waiting = 0
        self._deadlines: list[tuple[float, int]] = []

    # ---- inputs --------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self.waiting["interactive"]) + len(self.waiting["bulk"])

    def add(self, req: SchedRequest) -> None:
        """Queue a request; raises ``QueueFull`` past ``max_queue_size``, ``Unreachable``
        for a search whose deadline cannot be met now, ``Hopeless`` for one whose mode takes
        longer than its whole timeout."""
        rows = req.rows_as(req.tier) if req.tier is not None else req.n_seqs
        if rows > self._pool_rows(req.tier):
            raise ValueError(f"request needs {rows} slots, its pool has {self._pool_rows(req.tier)}")
        if self.queue_depth >= self.cfg.max_queue_size:
            raise QueueFull()
        if req.tier is not None and self._pooled(req.tier) and req.priority == "interactive":
            self._check_reachable(req, rows)  # a bulk search steps down instead (``_overdue``)
        self.waiting[req.priority].append(req)
        self._by_id[req.req_id] = req
        if math.isfinite(req.deadline_s):  # one that never expires never makes a plan scan
            heapq.heappush(self._deadlines, (req.deadline_s, req.req_id))

    def cancel(self, req_id: int) -> None:
        """Mark a request cancelled; it leaves at the next plan. Unknown ids are ignored."""
        r = self._by_id.get(req_id)
        if r is not None:
            r.cancelled = True
            if req_id not in self.running:
                self._cancelled_waiting += 1

    def on_seqs_finished(self, req_id: int, count: int, now_s: float | None = None) -> bool:
        """Record finished sequences of a running request; True when the request is done
        (``now_s``: when, for the measured service time of its mode)."""
        r = self.running.get(req_id)
        if r is None:
            return False
        r.remaining -= count
        self._free(r, count)
        if r.remaining <= 0:
            del self.running[req_id]
            self._by_id.pop(req_id, None)
            if now_s is not None and r.tier is not None:
                old = self.service_s.get(r.tier)
                took = now_s - r.admitted_s
                self.service_s[r.tier] = took if old is None else old + EWMA_WEIGHT * (took - old)
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
        self._deadlines.clear()
        self._cancelled_waiting = 0
        self.live_seqs = self.live_bulk_seqs = self.live_search_rows = self.live_bulk_search_rows = 0

    def tier_of(self, req_id: int) -> Served | None:
        r = self._by_id.get(req_id)
        return r.tier if r is not None else None

    def _pooled(self, tier: Served) -> bool:
        """Whether ``tier``'s rows come from the search pool."""
        return self.cfg.beam_rows > 0 and tier in SEARCH_OF

    def _pool_rows(self, tier: Served | None) -> int:
        return self.cfg.beam_rows if tier is not None and self._pooled(tier) else self.cfg.max_batch_size

    def _free(self, r: SchedRequest, count: int) -> None:
        if self._pooled_tier(r):
            self.live_search_rows -= count
            if r.priority == "bulk":
                self.live_bulk_search_rows -= count
            return
        self.live_seqs -= count
        if r.priority == "bulk":
            self.live_bulk_seqs -= count

    def _check_reachable(self, req: SchedRequest, rows: int) -> None:
        """Raise ``Unreachable`` when, at the measured service time of its mode, the search
        rows ahead of ``req`` (running and waiting) leave it no time before its deadline."""
        assert req.tier is not None
        took = self.service_s.get(req.tier)
        if took is None or not math.isfinite(req.deadline_s):
            return
        if took > req.deadline_s - req.arrival_s:
            raise Hopeless(req.tier, took, req.deadline_s - req.arrival_s)
        ahead = self.live_search_rows + sum(
            r.rows_as(r.tier) for q in self.waiting.values() for r in q
            if r.tier is not None and self._pooled(r.tier))
        start_s = took * (ahead // self.cfg.beam_rows)  # whole searches ahead, each ``took``
        if req.arrival_s + start_s + took > req.deadline_s:
            raise Unreachable(start_s)

    # ---- the plan --------------------------------------------------------------------------
    def plan(self, now_s: float) -> StepPlan:
        plan = StepPlan()
        for q in self.waiting.values() if self._queue_changed(now_s) else ():
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
            if r.cancelled or r.deadline_s + RUNNING_GRACE_S <= now_s:
                plan.release.append(r.req_id)
                self.fail_running(r.req_id)
        self._admit(plan, now_s)
        admitted = sum(self._by_id[i].remaining for i in plan.prefill if i in self._by_id)
        plan.decode = self.live_seqs + self.live_search_rows > admitted
        if not plan.has_work and self.queue_depth:
            plan.idle_wait_s = self._idle_wait_s(now_s)
        return plan

    def _queue_changed(self, now_s: float) -> bool:
        """Whether a waiting request was cancelled or reached its deadline: only then does a
        plan scan the queue (a full one holds a thousand requests; a plan comes every step)."""
        due = self._cancelled_waiting > 0
        heap = self._deadlines
        while heap and heap[0][0] <= now_s:
            rid = heapq.heappop(heap)[1]
            due = due or (rid in self._by_id and rid not in self.running)
        self._cancelled_waiting = 0
        return due

    def _idle_wait_s(self, now_s: float) -> float:
        """How long an engine with nothing to run may sleep: until the first waiting request's
        max wait ends; past it, nothing was admitted, and only a new input (which wakes the
        engine) or a waiting request's deadline changes that, so until the first deadline."""
        waiting = [r for q in self.waiting.values() for r in q]
        first = min(r.arrival_s for r in waiting) + self.cfg.max_wait_ms / 1000.0
        if first > now_s:
            return first - now_s
        return max(0.0, min(r.deadline_s for r in waiting) - now_s)

    def _admit(self, plan: StepPlan, now_s: float) -> None:
        cap = self.cfg.max_batch_size
        if self.cfg.batching == "static" and self.live_seqs + self.live_search_rows > 0:
            return
        if not self.queue_depth:
            return
        main_ok = True
        if self.live_seqs + self.live_search_rows == 0:
            first = min(q[0].arrival_s for q in self.waiting.values() if q)
            if self._waiting_seqs(cap) < cap and now_s < first + self.cfg.max_wait_ms / 1000.0:
                return  # idle: give the first request up to max_wait_ms to gather companions
        elif self.live_seqs > 0:
            # running: let newcomers join in groups (prefill grouping, docstring)
            main_ok = cap - self.live_seqs >= self._waiting_seqs(self.cfg.prefill_group)
        # more rows asked for than free: the engine is saturated, auto requests get no search
        self._backlog = self._waiting_seqs(cap - self.live_seqs + 1) > cap - self.live_seqs
        bulk_q, inter_q = self.waiting["bulk"], self.waiting["interactive"]
        reserve = max(0, self._bulk_floor() - self.live_bulk_seqs) if bulk_q else 0
        self._take(inter_q, cap - self.live_seqs - reserve if main_ok else 0, plan, now_s)
        bulk_room = cap - self.live_seqs
        if inter_q or self.live_seqs > self.live_bulk_seqs:  # interactive work: bulk keeps to its floor
            bulk_room = min(bulk_room, self._bulk_floor() - self.live_bulk_seqs)
        self._take(bulk_q, bulk_room if main_ok else 0, plan, now_s)

    def _bulk_floor(self) -> int:
        """Main rows bulk may hold beside interactive work: its share (``bulk_rows``), or its
        head's rows while it holds none (a bulk request wider than a share above 0 still runs), but
        never so many that the interactive head cannot fit once the rows it waits for are free.
        So the head of the interactive queue waits at most for the rows running when it
        became the head, whatever the pool's size (with 8 rows the share is one row, and an
        ``n=8`` request beside it would otherwise never fit)."""
        cap = self.cfg.max_batch_size
        floor = bulk_rows(cap, self.cfg.bulk_min_share)
        bulk_q = self.waiting["bulk"]
        if floor and bulk_q and self.live_bulk_seqs == 0 and not self._pooled_tier(bulk_q[0]):
            floor = max(floor, bulk_q[0].n_seqs)
        head = next((r for r in self.waiting["interactive"] if not self._pooled_tier(r)), None)
        return floor if head is None else min(floor, cap - head.n_seqs)

    def _pooled_tier(self, r: SchedRequest) -> bool:
        """Whether ``r``'s rows come from the search pool (an ``auto`` one: not yet known, so
        counted in the main pool, where its greedy answer would run)."""
        return r.tier is not None and self._pooled(r.tier)

    def _waiting_seqs(self, limit: int) -> int:
        """Sequences waiting, counted up to ``limit`` (each step asks; the queue can be long)."""
        n = 0
        for q in self.waiting.values():
            for r in q:
                n += r.n_seqs
                if n >= limit:
                    return limit
        return n

    def _search_room(self, priority: Priority) -> int:
        """Free rows of the search pool for a request of ``priority``: while interactive work
        runs or waits, bulk searches keep to the bulk share of the main rows (at least one
        good search): a search row costs a step what a greedy row does."""
        room = self.cfg.beam_rows - self.live_search_rows
        if priority == "bulk" and self._interactive_work():
            share = max(bulk_rows(self.cfg.max_batch_size, self.cfg.bulk_min_share), SEARCH_OF["good"].width)
            room = min(room, share - self.live_bulk_search_rows)
        return room

    def _interactive_work(self) -> bool:
        return bool(self.waiting["interactive"] or self.live_search_rows > self.live_bulk_search_rows
                    or self.live_seqs > self.live_bulk_seqs)

    def _measured_wait_s(self, now_s: float) -> float:
        """The queue wait of interactive requests for the main rows: the recent admissions'
        (``wait_s``) and the oldest waiting one's (searches waiting for their pool's rows
        are not counted: the free search rows say that)."""
        for r in self.waiting["interactive"]:
            if r.tier is None or not self._pooled(r.tier):
                return max(self.wait_s, now_s - r.arrival_s)
        return self.wait_s

    def _choose(self, r: SchedRequest, room: int, now_s: float, searches: bool = True) -> Served:
        """The mode of an ``auto`` request admitted now (``StepDown.choose``)."""
        free = (self._search_room(r.priority) if self.cfg.beam_rows > 0 else room) if searches else 0
        step_down = self.cfg.step_down
        backlog = self._backlog or step_down.busy(self.live_seqs, self.cfg.max_batch_size)
        return step_down.choose(
            wait_s=self._measured_wait_s(now_s), timeout_s=r.deadline_s - r.arrival_s,
            left_s=r.deadline_s - now_s, free_rows=free, service_s=self.service_s, backlog=backlog)

    def _take(self, q: deque[SchedRequest], room: int, plan: StepPlan, now_s: float) -> None:
        """Admit from ``q`` in order while its head fits: greedy rows from ``room``, searches
        from the search pool. A search that does not fit waits without holding up the
        greedy requests behind it (nor the searches behind it: FIFO within a pool)."""
        skipped: list[SchedRequest] = []
        while q:
            r = q[0]
            # an auto request behind a search that waits for rows is not searched ahead of it
            tier = r.tier if r.tier is not None else self._choose(r, room, now_s, searches=not skipped)
            if tier == "best" and r.priority == "bulk" and self._pooled(tier) and not skipped:
                tier = self._bulk_search(r)
            rows = r.rows_as(tier)
            if self._pooled(tier) and (skipped or rows > self._search_room(r.priority)):
                if not self._overdue(r, now_s):
                    skipped.append(q.popleft())
                    continue
                tier, rows = "fast", r.rows_as("fast")  # kept out too long: written greedily
            if not self._pooled(tier):
                if rows > room:
                    break
                room -= rows
            q.popleft()
            self._start(r, tier, rows, plan, now_s)
        q.extendleft(reversed(skipped))

    def _bulk_search(self, r: SchedRequest) -> Served:
        """A bulk best search that does not fit the bulk share beside interactive work runs
        as a good one (its answer says so), so a job progresses without slowing interactive
        answers more than its share; with the engine to itself it is searched at full width."""
        room = self._search_room("bulk")
        if r.rows_as("best") <= room or r.rows_as("good") > room:
            return "best"
        return "good"

    def _overdue(self, r: SchedRequest, now_s: float) -> bool:
        """Whether bulk search ``r`` has waited for search rows as long as it may while
        interactive searches hold or wait for them: then it is written greedily in the main
        pool, where bulk has its floor (its answer says ``fast``), instead of waiting for its
        deadline under steady interactive search demand. Behind bulk searches alone it waits
        its turn (a job's items progress in order)."""
        if r.priority != "bulk":
            return False
        bound_s = min(BULK_SEARCH_MAX_WAIT_S, BULK_SEARCH_WAIT_SHARE * (r.deadline_s - r.arrival_s))
        return now_s - r.arrival_s >= bound_s and self._interactive_searches()

    def _interactive_searches(self) -> bool:
        """Whether interactive searches hold search rows or wait for them."""
        return self.live_search_rows > self.live_bulk_search_rows or any(
            self._pooled_tier(r) for r in self.waiting["interactive"])

    def _start(self, r: SchedRequest, tier: Served, rows: int, plan: StepPlan, now_s: float) -> None:
        auto = r.tier is None
        if r.tier != tier:  # chosen now (auto), or a bulk search stepped down
            plan.tiers[r.req_id] = tier
        r.tier, r.remaining, r.admitted_s = tier, rows, now_s
        self.running[r.req_id] = r
        if r.priority == "interactive" and (auto or not self._pooled(tier)):
            self.wait_s += EWMA_WEIGHT * (now_s - r.arrival_s - self.wait_s)
        if self._pooled(tier):
            self.live_search_rows += rows
            if r.priority == "bulk":
                self.live_bulk_search_rows += rows
        else:
            self.live_seqs += rows
            if r.priority == "bulk":
                self.live_bulk_seqs += rows
        plan.prefill.append(r.req_id)
