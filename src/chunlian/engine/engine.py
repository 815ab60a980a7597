"""The async engine: ``await engine.generate(request)`` for the API and the job workers.

A thin client of one ``EngineCore`` (``engine.core``), which runs on one dedicated engine
thread (torch releases the GIL inside its kernels, so the event loop stays responsive). The
event loop never touches the core: it queues adds and aborts in an inbox, which the engine
thread applies before each step, and awaits futures. Every request's future is completed on
every path: result, error, deadline, cancellation, overload and shutdown.

    event loop                         engine thread
    generate() ──add──▶ inbox ──▶ EngineCore.add_request / abort, then EngineCore.step()
        ▲                                              │ CoreOutputs (results and errors)
        └──── Outbox: one call_soon_threadsafe per step ◀┘

Identical requests in flight share one generation (coalescing); the core never sees the
duplicates.
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

from chunlian.engine.coalesce import InFlight, Submitted
from chunlian.engine.config import EngineConfig
from chunlian.engine.core import CoreOutput, CoreRequest, EngineCore, Runner
from chunlian.engine.outbox import Outbox
from chunlian.engine.rates import RateWindow
from chunlian.engine.rerank import HengpiChooser
from chunlian.engine.scheduler import Scheduler
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.errors import ChunlianError, EngineStopped, InvalidInput, ModelError, Overloaded
from chunlian.types import CoupletRequest, CoupletResult

__all__ = ["Engine", "EngineStats", "Runner", "StepReport", "lower_thread_priority"]

RATE_WINDOW_S = 10  # the rejection rate is measured over this many seconds
MAX_RETRY_AFTER_S = 60.0
IDLE_POLL_S = 0.5  # an idle engine thread looks at its inbox at least this often
JOIN_LIMIT_S = 10.0  # how long ``stop`` waits for the engine thread to end its step

log = logging.getLogger("chunlian.engine")


class Engine:
    """The core on its own thread, behind ``generate``; see the module docstring."""

    def __init__(
        self, config: EngineConfig, runner: Runner, hengpi: HengpiChooser | None = None,
        model_tag: str = "chunlian-couplet@dev", core: EngineCore | None = None,
    ) -> None:
        self.config = config
        self.core = core if core is not None else EngineCore(config, runner, hengpi, model_tag)
        self._cv = threading.Condition()
        self._inbox: deque[CoreRequest | int] = deque()  # adds, and aborts (a request id)
        self._queued_adds = 0  # adds in the inbox: counted against the queue's bound
        self._pending: dict[int, asyncio.Future[CoupletResult]] = {}  # req_id -> the answer's future
        self._inflight: InFlight[CoupletResult] = InFlight(config.coalesce)
        self._ids = itertools.count(1)
        self._rejected = RateWindow(RATE_WINDOW_S)
        self._outbox = Outbox()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._failure: BaseException | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """Load the model ``config`` names and build an engine around it."""
        core = EngineCore.from_config(config)
        return cls(config, core.runner, core=core)

    # the core's parts, for metrics and tests
    @property
    def runner(self) -> Runner:
        return self.core.runner

    @property
    def queue_depth(self) -> int:
        """Requests waiting: in the core's queue, or in the inbox on their way to it."""
        return self.core.queue_depth + self._queued_adds

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def stats(self) -> EngineStats:
        stats = self.core.stats
        stats.coalesced = self._inflight.coalesced  # counted here, in front of the core
        stats.queue_depth = self.queue_depth  # the inbox's adds wait too
        return stats

    @property
    def model_tag(self) -> str:
        return self.core.model_tag

    @property
    def search_tag(self) -> str:
        return self.core.search_tag

    @property
    def hengpi(self) -> HengpiChooser | None:
        return self.core.hengpi

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="chunlian-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop; every pending request fails with ``EngineStopped``. Only the
        engine thread touches the core: it fails the core's requests as it ends. When it does
        not end within ``JOIN_LIMIT_S`` (a step that hangs), the callers are answered here
        without the core, which the thread fails when its step returns."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, JOIN_LIMIT_S)
        error = EngineStopped("engine stopped")
        if self._thread is None or not self._thread.is_alive():
            self._fail_all(error)
            return
        log.error("the engine thread did not end within %.0f s; its callers are answered now", JOIN_LIMIT_S)
        for fut in list(self._pending.values()):
            self._outbox.settle(fut, None, error)
        self._outbox.flush(self._loop)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self.core.add_step_listener(fn)

    def drain_rate_per_s(self) -> float:
        """Requests completed per second over the recent window (0 when unknown)."""
        return self.core.drain_rate_per_s()

    def retry_after_s(self, now_s: float | None = None) -> float:
        """When a rejected client should come back: the queue's drain time, stretched by the
        pressure on it (every rejected client returns, so with ``r`` rejections per second
        against a drain of ``d`` per second a retry meets about ``1 + r/d`` times the queue).
        Spreading the retries this way keeps a storm of 429s from becoming the load."""
        now = time.monotonic() if now_s is None else now_s
        rate = self.core.drain_rate_per_s(now)
        if rate <= 0:
            return 1.0
        pressure = 1.0 + self._rejected.count(now) / RATE_WINDOW_S / rate
        return min(MAX_RETRY_AFTER_S, max(1.0, self.queue_depth / rate * pressure))

    # ---- the public call ------------------------------------------------------------------------
    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate a couplet; raises Overloaded, DeadlineExceeded, Cancelled, EngineStopped."""
        if not self.running or self._loop is None:
            raise EngineStopped("engine is not running")
        if req.params.rows > self.config.max_batch_size:
            raise InvalidInput(f"n must be at most {self.config.max_batch_size}", "n")
        timeout_s = self.config.timeout_s(req)
        # the core enforces the deadline; the extra second only guards against a stuck
        # engine so that no caller ever waits for ever
        return await self._inflight.wait(req.identity(), lambda: self._submit(req, timeout_s), timeout_s + 1.0,
                                         bulk=req.priority == "bulk")

    def _submit(self, req: CoupletRequest, timeout_s: float) -> Submitted[CoupletResult]:
        assert self._loop is not None
        now = time.monotonic()
        if self.queue_depth >= self.config.max_queue_size:
            self.core.stats.rejected += 1
            self._rejected.add(now)
            raise Overloaded(f"queue full ({self.config.max_queue_size} waiting)", self.retry_after_s())
        req_id = next(self._ids)
        fut: asyncio.Future[CoupletResult] = self._loop.create_future()
        self._pending[req_id] = fut
        with self._cv:
            self._inbox.append(CoreRequest(req_id, req, now + timeout_s))
            self._queued_adds += 1
            self._cv.notify()
        return fut, lambda: self._abort(req_id)

    def _abort(self, req_id: int) -> None:
        """The request's last caller went away: the core ends it (``Cancelled``)."""
        with self._cv:
            self._inbox.append(req_id)
            self._cv.notify()

    # ---- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            lower_thread_priority(self.config.engine_nice)
            self.core.bind_thread()
            wait_s: float | None = 0.0
            while True:
                with self._cv:
                    if not self._inbox and not self._stopping and wait_s is not None and wait_s > 0:
                        self._cv.wait(timeout=min(wait_s, IDLE_POLL_S))
                    if self._stopping:
                        break
                    inbox, self._inbox = self._inbox, deque()
                    self._queued_adds = 0
                self._apply(inbox)
                self._settle(self.core.step())
                wait_s = self.core.idle_wait_s
            self._settle(self.core.fail_all(EngineStopped("engine stopped")))
        except BaseException as e:  # engine failure: complete every pending future
            log.exception("engine loop failed")
            self._failure = e
            self._settle(self.core.fail_all(EngineStopped(f"engine failed: {type(e).__name__}")))
        finally:
            self._stopping = True
            self._outbox.flush(self._loop)

    def _apply(self, inbox: deque[CoreRequest | int]) -> None:
        """Hand the inbox to the core, in order (an abort never overtakes its add)."""
        aborts: list[int] = []
        for item in inbox:
            if isinstance(item, int):
                aborts.append(item)
                continue
            try:
                self.core.add_request(item)
            except ChunlianError as e:  # refused at admission: the queue filled meanwhile
                if isinstance(e, Overloaded):
                    e = Overloaded(str(e), self.retry_after_s())
                    self._rejected.add(time.monotonic())
                self._settle([CoreOutput(item.req_id, error=e)])
            except Exception as e:  # noqa: BLE001 - a request never ends the engine thread
                log.exception("admission failed")
                self._settle([CoreOutput(item.req_id, error=ModelError(f"admission failed: {type(e).__name__}"))])
        if aborts:
            self.core.abort(aborts)

    def _settle(self, outputs: list[CoreOutput]) -> None:
        """Queue each output's settlement, and hand them to the event loop in one call."""
        for out in outputs:
            fut = self._pending.pop(out.req_id, None)
            if fut is not None:
                self._outbox.settle(fut, out.result, out.error)
        self._outbox.flush(self._loop)

    def _fail_all(self, error: ChunlianError) -> None:
        """After the thread has ended (it failed the core's requests as it did): the
        inbox's requests, which never reached the core, fail."""
        with self._cv:
            inbox, self._inbox = self._inbox, deque()
        self._settle([CoreOutput(i.req_id, error=error) for i in inbox if not isinstance(i, int)])


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
