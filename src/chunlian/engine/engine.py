"""The async engine: ``await engine.generate(request)`` for the API and the job workers.

The model runs on one dedicated engine thread (torch releases the GIL inside its kernels,
so the event loop stays responsive); the event loop only queues requests and awaits
futures. Every request's future is completed on every path: result, error, deadline,
cancellation, overload and shutdown.

    event loop                         engine thread
    generate() ──submit──▶ inbox ──▶ Scheduler.plan() ─▶ ModelRunner.step (prefill+decode)
        ▲                                     │ finished sequences → rerank, 横批
        └──── call_soon_threadsafe(set_result/set_exception) ◀──┘
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chunlian.engine.config import EngineConfig
from chunlian.engine.outbox import Outbox
from chunlian.engine.rates import RateWindow
from chunlian.engine.request import SeqOutput, SeqSpec, expand
from chunlian.engine.rerank import HengpiChooser, build_result
from chunlian.engine.scheduler import QueueFull, SchedRequest, Scheduler, SchedulerConfig
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.errors import (
    Cancelled,
    ChunlianError,
    DeadlineExceeded,
    EngineStopped,
    InvalidInput,
    ModelError,
    Overloaded,
)
from chunlian.types import CoupletRequest, CoupletResult, RequestIdentity

__all__ = ["Engine", "EngineStats", "Runner", "StepReport", "lower_thread_priority"]

RATE_WINDOW_S = 10  # drain and rejection rates are measured over this many seconds
MAX_RETRY_AFTER_S = 60.0

log = logging.getLogger("chunlian.engine")


class Runner(Protocol):
    """What the engine needs of a model runner (``ModelRunner`` or a fake in tests)."""

    capacity: int
    tokens_emitted: int
    padded_batches: bool  # set for static batching: one padded rectangle per batch

    # decode the live rows and admit ``specs`` (either may be empty): one iteration
    def step(self, specs: list[SeqSpec]) -> list[SeqOutput]: ...
    def release(self, seq_ids: set[int] | list[int]) -> None: ...
    def bind_thread(self) -> None: ...  # called on the engine thread before its first step


@dataclass
class _Pending:
    req_id: int
    request: CoupletRequest
    specs: list[SeqSpec]
    future: asyncio.Future[CoupletResult]
    identity: RequestIdentity | None
    waiters: int = 1
    outputs: list[SeqOutput] = field(default_factory=list)


class Engine:
    """Continuous (or static) batching over a slot KV cache; see the module docstring."""

    def __init__(
        self, config: EngineConfig, runner: Runner, hengpi: HengpiChooser | None = None,
        model_tag: str = "chunlian-couplet@dev",
    ) -> None:
        if config.max_batch_size > runner.capacity:
            raise ValueError(f"runner capacity {runner.capacity} < max_batch_size {config.max_batch_size}")
        self.config = config
        self.runner = runner
        runner.padded_batches = config.batching == "static"
        self.hengpi = hengpi
        self.model_tag = model_tag
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms,
            max_queue_size=config.max_queue_size, batching=config.batching,
            bulk_min_share=config.bulk_min_share, min_prefill_seqs=config.min_prefill_seqs,
        ))
        self.stats = EngineStats(max_queue_size=config.max_queue_size)
        self._cv = threading.Condition()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._pending: dict[int, _Pending] = {}  # req_id -> pending (engine-side registry)
        self._seq_owner: dict[int, int] = {}
        self._inflight: dict[RequestIdentity, _Pending] = {}  # identity -> pending (event-loop side)
        self._ids = itertools.count(1)
        self._seq_ids = itertools.count(1)
        self._done = RateWindow(RATE_WINDOW_S)  # completed requests (engine thread)
        self._rejected = RateWindow(RATE_WINDOW_S)  # queue-full rejections (event loop)
        self._listeners: list[Callable[[StepReport], None]] = []
        # settlements of futures, handed to the event loop once per engine iteration
        # (``_flush``): one wake-up of the loop per step instead of one per request
        self._outbox = Outbox()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._failure: BaseException | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """Load the model ``config`` names and build an engine around it."""
        from chunlian.engine.runner import ModelRunner, single_threaded_here
        from chunlian.model.checkpoint import load_weights
        from chunlian.model.hengpi import HengpiSelector

        # the model runs on the engine thread: only that thread may own a multi-thread
        # torch team (ModelRunner.bind_thread says why)
        single_threaded_here()
        loaded = load_weights(config.model_path, config.device)
        log.info("loaded %s on %s", loaded.tag, config.device)
        runner = ModelRunner(
            loaded, capacity=config.max_batch_size, device=config.device,
            threads=config.torch_threads, blocklist=config.blocklist,
        )
        return cls(config, runner, HengpiSelector.from_loaded(loaded), loaded.tag)

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="chunlian-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop; every pending request fails with ``EngineStopped``."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
        self._fail_all(EngineStopped("engine stopped"))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self._listeners.append(fn)

    def drain_rate_per_s(self) -> float:
        """Requests completed per second over the recent window (0 when unknown)."""
        return self._done.per_s(time.monotonic())

    def retry_after_s(self, now_s: float | None = None) -> float:
        """When a rejected client should come back: the queue's drain time, stretched by the
        pressure on it (every rejected client returns, so with ``r`` rejections per second
        against a drain of ``d`` per second a retry meets about ``1 + r/d`` times the queue).
        Spreading the retries this way keeps a storm of 429s from becoming the load."""
        now = time.monotonic() if now_s is None else now_s
        rate = self._done.per_s(now)
        if rate <= 0:
            return 1.0
        pressure = 1.0 + self._rejected.count(now) / RATE_WINDOW_S / rate
        return min(MAX_RETRY_AFTER_S, max(1.0, self.scheduler.queue_depth / rate * pressure))

    # ---- the public call ------------------------------------------------------------------------
    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate a couplet; raises Overloaded, DeadlineExceeded, Cancelled, EngineStopped."""
        if not self.running or self._loop is None:
            raise EngineStopped("engine is not running")
        if req.params.n > self.config.max_batch_size:
            raise InvalidInput(f"n must be at most {self.config.max_batch_size}", "n")
        timeout_s = req.timeout_s if req.timeout_s is not None else self.config.default_timeout_ms / 1000
        identity = req.identity()
        pending = self._inflight.get(identity) if self.config.coalesce else None
        if pending is not None and not pending.future.done():
            pending.waiters += 1
            self.stats.coalesced += 1
        else:
            pending = self._submit(req, identity, timeout_s)
        try:
            # The scheduler enforces the deadline; the extra second only guards against a
            # stuck engine so that no caller ever waits for ever.
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_s + 1.0)
        except TimeoutError:
            self._cancel(pending)
            raise DeadlineExceeded(f"no answer within {timeout_s:.3f} s") from None
        except asyncio.CancelledError:
            self._cancel(pending)
            raise

    def _submit(self, req: CoupletRequest, identity: RequestIdentity, timeout_s: float) -> _Pending:
        assert self._loop is not None
        req_id = next(self._ids)
        specs = expand(req, next(self._seq_ids))
        for _ in range(len(specs) - 1):
            next(self._seq_ids)
        now = time.monotonic()
        fut: asyncio.Future[CoupletResult] = self._loop.create_future()
        pending = _Pending(req_id, req, specs, fut, identity)
        sr = SchedRequest(req_id, req.priority, len(specs), now, now + timeout_s)
        with self._cv:
            try:
                self.scheduler.add(sr)
            except QueueFull:
                self.stats.rejected += 1
                self._rejected.add(now)
                raise Overloaded(
                    f"queue full ({self.config.max_queue_size} waiting)", self.retry_after_s()
                ) from None
            self._pending[req_id] = pending
            for s in specs:
                self._seq_owner[s.seq_id] = req_id
            self.stats.queue_depth = self.scheduler.queue_depth
            self._cv.notify()
        if self.config.coalesce:  # else nothing ever looks it up
            self._inflight[identity] = pending
            fut.add_done_callback(lambda _f: self._forget(identity, pending))
        return pending

    def _forget(self, identity: RequestIdentity, pending: _Pending) -> None:
        if self._inflight.get(identity) is pending:
            del self._inflight[identity]

    def _cancel(self, pending: _Pending) -> None:
        """A caller went away; the request is cancelled when its last waiter has gone."""
        pending.waiters -= 1
        if pending.waiters > 0 or pending.future.done():
            return
        with self._cv:
            self.scheduler.cancel(pending.req_id)
            self._cv.notify()

    # ---- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            lower_thread_priority(self.config.engine_nice)
            self.runner.bind_thread()
            while True:
                with self._cv:
                    if self._stopping:
                        return
                    plan = self.scheduler.plan(time.monotonic())
                    self.stats.queue_depth = self.scheduler.queue_depth
                    if not plan.has_work and not (plan.expired or plan.cancelled or plan.release):
                        self._cv.wait(timeout=plan.idle_wait_s if plan.idle_wait_s is not None else 0.5)
                        continue
                    admitted = [self._pending[i] for i in plan.prefill if i in self._pending]
                self._drop(plan.expired, DeadlineExceeded("deadline passed while queued"), "deadline")
                self._drop(plan.cancelled, Cancelled("request cancelled"), "cancel")
                self._release(plan.release)
                self.stats.running = self.scheduler.live_seqs  # also when nothing runs next
                if plan.has_work:
                    self._step(admitted, plan.decode)
                self._flush()
        except BaseException as e:  # engine failure: complete every pending future
            log.exception("engine loop failed")
            self._failure = e
            self._fail_all(EngineStopped(f"engine failed: {type(e).__name__}"))
        finally:
            self._stopping = True
            self._flush()

    def _step(self, admitted: list[_Pending], decode: bool) -> None:
        t0 = time.perf_counter()
        tokens0 = self.runner.tokens_emitted
        finished: list[SeqOutput] = []
        batch = self.scheduler.live_seqs
        try:
            specs = [s for p in admitted for s in p.specs]
            if specs or decode:  # the runner fuses a decode with an admission (one pass)
                finished += self.runner.step(specs)
            self.stats.prefill_total += len(admitted)
        except Exception as e:  # a failed step fails the requests in it, not the engine
            log.exception("model step failed")
            # every live row took part in the batched step: fail those requests only
            self._release(list(self.scheduler.running), ModelError(f"generation failed: {type(e).__name__}"))
            return
        dt = time.perf_counter() - t0
        tokens = self.runner.tokens_emitted - tokens0
        self.stats.steps_total += 1
        self.stats.tokens_total += tokens
        for fn in self._listeners:
            try:
                fn(StepReport(batch, dt, tokens))
            except Exception:  # a metrics hook must never take the engine down
                log.exception("step listener failed")
        self._collect(finished)
        self.stats.running = self.scheduler.live_seqs

    def _collect(self, finished: list[SeqOutput]) -> None:
        for out in finished:
            req_id = self._seq_owner.pop(out.seq_id, None)
            p = self._pending.get(req_id) if req_id is not None else None
            if p is None:
                continue
            p.outputs.append(out)
            with self._cv:
                done = self.scheduler.on_seqs_finished(p.req_id, 1)
            if not done:
                continue
            self._pending.pop(p.req_id, None)
            try:
                result = build_result(p.request, p.outputs, self.hengpi, self.model_tag)
            except ChunlianError as e:
                self._complete(p, error=e)
            except Exception as e:  # an error in one request completes only its future
                log.exception("post-processing failed")
                self._complete(p, error=ModelError(f"post-processing failed: {type(e).__name__}"))
            else:
                self._done.add(time.monotonic())
                self._complete(p, result=result)

    def _drop(self, req_ids: list[int], error: ChunlianError, kind: str) -> None:
        for rid in req_ids:
            p = self._pending.pop(rid, None)
            if p is None:
                continue
            for s in p.specs:
                self._seq_owner.pop(s.seq_id, None)
            if kind == "deadline":
                self.stats.deadline_drops += 1
            self._complete(p, error=error)

    def _release(self, req_ids: list[int], error: ChunlianError | None = None) -> None:
        """Free the slots of running requests (cancelled, past deadline, or failed)."""
        for rid in req_ids:
            p = self._pending.pop(rid, None)
            with self._cv:
                self.scheduler.fail_running(rid)
            if p is None:
                continue
            self.runner.release([s.seq_id for s in p.specs])
            for s in p.specs:
                self._seq_owner.pop(s.seq_id, None)
            if error is not None:
                err = error
            elif p.waiters <= 0:
                err = Cancelled("request cancelled")
            else:
                err = DeadlineExceeded("deadline passed while generating")
                self.stats.deadline_drops += 1
            self._complete(p, error=err)

    def _complete(self, p: _Pending, result: CoupletResult | None = None, error: BaseException | None = None) -> None:
        if error is not None:
            if isinstance(error, Cancelled):
                self.stats.cancelled += 1
            else:
                self.stats.failed += 1
        else:
            self.stats.completed += 1

        self._outbox.settle(p.future, result, error)

    def _flush(self) -> None:
        """Hand every settlement queued by ``_complete`` to the event loop in one call."""
        self._outbox.flush(self._loop)

    def _fail_all(self, error: ChunlianError) -> None:
        with self._cv:
            pending = list(self._pending.values())
            self._pending.clear()
            self._seq_owner.clear()
        for p in pending:
            self._complete(p, error=error)
        self._flush()


def lower_thread_priority(nice: int) -> bool:
    """Raise the calling thread's nice value by ``nice`` (Linux: per thread, inherited by
    the threads it starts afterwards, such as torch's OpenMP workers). Returns whether it
    took effect; lowering a priority needs no privilege, so failure is only logged."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        log.warning("could not lower the engine thread's priority: %s", e)
        return False
    return True
