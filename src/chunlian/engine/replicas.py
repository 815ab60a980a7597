"""Several engine processes behind one dispatcher (``CHUNLIAN_ENGINE_REPLICAS``): data
parallelism across the cores instead of intra-op threads.

    API process                                       engine processes (engine.process)
    ReplicatedEngine.generate() ── least loaded ──▶ ProcessEngine 0 ─▶ model, scheduler, 1 thread
                                └────────────────▶ ProcessEngine 1 ─▶ model, scheduler, 1 thread

Why: this model's matrices are small (d_model 192), so a forward pass is ~100 short ops,
and splitting each over two OpenMP threads is mostly synchronisation; worse, when anything
else (the event loop, the load) takes a core for a moment, every op waits for its preempted
thread. Two single-threaded engines in their own processes share nothing per op, and serve
more than one engine with two threads (figures: ``docs/performance.md``, "Measurements
behind the code"). Two runners in one process would serialise their Python on the
interpreter lock.

Routing: each request goes to the running replica with the fewest rows outstanding
(ties: round robin). Identical requests in flight share one generation here, before routing
(``engine.coalesce``), so coalescing works as with one engine. The replicas share ``max_batch_size`` and ``max_queue_size`` (``share``), so the
instance's totals stay as configured; there are never more replicas than batch rows.

Every future completes on every path, as in ``ProcessEngine``: a replica's answer or error
is the caller's, except that a request whose replica died under it is sent once more to a
running one (generation has no side effects).
A supervisor task replaces a replica that stopped (a new process; back-off 1, 2, 5, 10, 30 s
between failed starts) while the others go on serving: ``running`` is true while any replica
runs, and ``/metrics`` shows ``chunlian_engine_replicas_up`` against
``chunlian_engine_replicas``. ``stop`` stops supervising, then every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

from chunlian import errors as E
from chunlian.engine.client import EngineClient
from chunlian.engine.coalesce import InFlight, Submitted
from chunlian.engine.config import EngineConfig
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.omp import usable_cores
from chunlian.types import CoupletRequest, CoupletResult

log = logging.getLogger("chunlian.engine")
SUPERVISE_EVERY_S = 0.5
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # after the 1st, 2nd, ... failed start in a row
GAUGES = frozenset({"queue_depth", "running", "max_queue_size"})  # EngineStats fields that are not counters


def share(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split into ``parts`` near-equal whole parts (the first
    ``total % parts`` get one more), so that the parts add up to ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def replica_config(config: EngineConfig, index: int) -> EngineConfig:
    """Replica ``index``'s configuration: a single engine with its share of the batch, the
    queue and the cores (``replica_threads``)."""
    return replace(
        config, replicas=1, torch_threads=config.replica_threads,
        max_batch_size=share(config.max_batch_size, config.replicas, index),
        max_queue_size=max(1, share(config.max_queue_size, config.replicas, index)),
    )


class ReplicatedEngine:
    """An ``EngineClient`` over several engine processes."""

    def __init__(self, config: EngineConfig, replicas: Sequence[EngineClient],
                 factory: Callable[[int], EngineClient] | None = None) -> None:
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.config = config
        self.replicas = list(replicas)
        self._factory = factory
        self._outstanding = [0] * len(self.replicas)  # sequences sent, not yet answered
        self._inflight: InFlight[CoupletResult] = InFlight(config.coalesce)
        self._next = itertools.count()  # round robin among equally loaded replicas
        self._listeners: list[Callable[[StepReport], None]] = []
        self._retired = EngineStats()  # the counters of replaced replicas (metrics never go back)
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._started = False
        self.restarts = 0  # replicas replaced since start

    @classmethod
    def from_config(cls, config: EngineConfig) -> ReplicatedEngine:
        """``config.replicas`` engine processes (spawned at ``start``), each restarted when
        it dies."""
        from chunlian.engine.process import ProcessEngine

        n, threads, cores = config.replicas, config.replica_threads, usable_cores()
        if n * threads > cores:  # both set by hand: say so once, the operator may mean it
            log.warning("%d engine replicas of %d torch threads each on %d usable cores: the threads "
                        "will take turns on the cores (set CHUNLIAN_ENGINE_REPLICAS=0 or "
                        "CHUNLIAN_TORCH_THREADS=0 to fit them)", n, threads, cores)

        def factory(i: int) -> EngineClient:
            return ProcessEngine(replica_config(config, i))

        return cls(config, [factory(i) for i in range(n)], factory)

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def model_tag(self) -> str:
        return self.replicas[0].model_tag

    @property
    def search_tag(self) -> str:
        return self.replicas[0].search_tag

    async def start(self) -> None:
        """Start every replica at once; if one fails, stop the others and raise its error.
        With a factory, a supervisor then replaces any replica that stops. Once: a second
        call returns at once (the runtime starts a child-process engine early, at load)."""
        if self._started:
            return
        self._started = True
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        log.info("%d engine replicas running", len(self.replicas))
        if self._factory is not None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def stop(self) -> None:
        """Stop supervising and stop every replica (pending requests fail with ``EngineStopped``)."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        results = await asyncio.gather(*(r.stop() for r in self.replicas), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.error("stopping an engine replica failed: %r", r)

    @property
    def running(self) -> bool:
        """True while any replica runs: a dead one is replaced while the others serve."""
        return not self._stopping and any(r.running for r in self.replicas)

    @property
    def replicas_up(self) -> int:
        return sum(1 for r in self.replicas if r.running)

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self._listeners.append(fn)
        for r in self.replicas:
            r.add_step_listener(fn)

    @property
    def stats(self) -> EngineStats:
        """Counters: every replica's, the replaced ones' included; gauges: the running
        replicas' (capacity: all of them). Read by the metrics at scrape time."""
        total = EngineStats()
        for f in fields(EngineStats):
            if f.name in GAUGES:
                live = self.replicas if f.name == "max_queue_size" else [r for r in self.replicas if r.running]
                value = sum(getattr(r.stats, f.name) for r in live)
            else:
                value = getattr(self._retired, f.name) + sum(getattr(r.stats, f.name) for r in self.replicas)
            setattr(total, f.name, value)
        total.coalesced += self._inflight.coalesced  # here, before routing: replicas never coalesce
        return total

    # ---- supervision -----------------------------------------------------------------------
    async def _supervise(self) -> None:
        failures = [0] * len(self.replicas)
        next_try_s = [0.0] * len(self.replicas)
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await asyncio.sleep(SUPERVISE_EVERY_S)
            for i, r in enumerate(self.replicas):
                if r.running or loop.time() < next_try_s[i] or self._stopping:
                    continue
                if failures[i] == 0:
                    log.error("engine replica %d stopped; starting a new one", i)
                if await self._replace(i):
                    failures[i] = 0
                else:
                    delay_s = RESTART_BACKOFF_S[min(failures[i], len(RESTART_BACKOFF_S) - 1)]
                    failures[i] += 1
                    next_try_s[i] = loop.time() + delay_s
                    log.warning("engine replica %d did not start (attempt %d); next try in %.0f s",
                                i, failures[i], delay_s)

    async def _replace(self, i: int) -> bool:
        """Start a new replica ``i``; swap it in once it runs. False when it failed to start."""
        assert self._factory is not None
        old = self.replicas[i]
        with contextlib.suppress(Exception):
            await old.stop()  # reaps the dead process; its pending requests have failed
        new = self._factory(i)
        for fn in self._listeners:
            new.add_step_listener(fn)
        try:
            await new.start()
        except Exception:  # noqa: BLE001 - retried with back-off by the supervisor
            with contextlib.suppress(Exception):
                await new.stop()
            return False
        if self._stopping:
            await new.stop()
            return True
        for f in fields(EngineStats):
            if f.name not in GAUGES:
                setattr(self._retired, f.name, getattr(self._retired, f.name) + getattr(old.stats, f.name))
        self.replicas[i] = new
        self.restarts += 1
        log.info("engine replica %d is running again", i)
        return True

    # ---- requests --------------------------------------------------------------------------
    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate on one replica (module docstring); raises what ``Engine.generate`` raises.
        Identical requests in flight share one generation (``engine.coalesce``)."""
        def submit() -> Submitted[CoupletResult]:
            task = asyncio.ensure_future(self._generate_routed(req))

            def abort() -> None:
                task.cancel()

            return task, abort

        # each replica guards its own deadline; this margin only outlasts theirs
        return await self._inflight.wait(req.identity(), submit, self.config.timeout_s(req) + 5.0,
                                         bulk=req.priority == "bulk")

    async def _generate_routed(self, req: CoupletRequest) -> CoupletResult:
        """A request whose replica stopped under it (``EngineStopped``) is sent once more, to
        another running replica: generation has no side effects, and a crash loses nothing."""
        try:
            return await self._generate_on(self._route(), req)
        except E.EngineStopped:
            if self._stopping or self.replicas_up == 0:
                raise
            log.warning("an engine replica stopped under a request; sending it to another")
            return await self._generate_on(self._route(), req)

    async def _generate_on(self, i: int, req: CoupletRequest) -> CoupletResult:
        rows = req.params.rows
        self._outstanding[i] += rows
        try:
            return await self.replicas[i].generate(req)
        finally:
            self._outstanding[i] -= rows

    def _route(self) -> int:
        alive = [i for i, r in enumerate(self.replicas) if r.running]
        if not alive:
            raise E.EngineStopped("engine is not running")
        least = min(self._outstanding[i] for i in alive)
        tied = [i for i in alive if self._outstanding[i] == least]
        return tied[next(self._next) % len(tied)]

