"""Several engine processes behind one dispatcher (``CHUNLIAN_ENGINE_REPLICAS``): data
parallelism across the cores instead of intra-op threads.

    API process                                       engine processes (engine.process)
    ReplicatedEngine.generate() ── least loaded ──▶ ProcessEngine 0 ─▶ model, scheduler, 1 thread
                                └────────────────▶ ProcessEngine 1 ─▶ model, scheduler, 1 thread

Why: this model's matrices are small (d_model 192), so a forward pass is ~100 short ops,
and splitting each over two OpenMP threads is mostly synchronisation; worse, when anything
else (the event loop, the load) takes a core for a moment, every op waits for its preempted
thread (a 10% competitor cost the engine 14-45%, ninth session). Two single-threaded engines
in their own processes share nothing per op: offline, on the seventeenth session's Zen 4
host, two of them at 32 rows each ran 324-333 seq/s against 230-266 for one engine with two
threads at 64 rows, and 387-437 at 64 rows each (``docs/benchmarks.md``). (Two runners in
one process serialise their Python on the interpreter lock: tenth session, not worth it.)

Routing: each request goes to the running replica with the fewest sequences outstanding
(ties: round robin). Identical requests in flight go to the replica that already runs the
first one, where that engine's coalescing merges them, so coalescing works as with one
engine. The replicas share ``max_batch_size`` and ``max_queue_size`` (``share``), so the
instance's totals stay as configured; there are never more replicas than batch rows.

Every future completes on every path, as in ``ProcessEngine``: a replica's answer or error
is the caller's; ``running`` is true only while every replica runs (one that dies makes the
instance not ready, as a dead single engine does, so the load balancer moves traffic away);
``stop`` stops them all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Protocol

from chunlian import errors as E
from chunlian.config import Settings
from chunlian.engine.engine import EngineStats, StepReport
from chunlian.types import CoupletRequest, CoupletResult, RequestIdentity

log = logging.getLogger("chunlian.engine")


class Replica(Protocol):
    """What the dispatcher needs of one engine (``ProcessEngine``; fakes in the tests)."""

    model_tag: str
    stats: EngineStats

    @property
    def running(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, req: CoupletRequest) -> CoupletResult: ...

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None: ...


def share(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split into ``parts`` near-equal whole parts (the first
    ``total % parts`` get one more), so that the parts add up to ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def replica_settings(settings: Settings, replicas: int, index: int) -> Settings:
    """Replica ``index``'s settings: a single engine with its share of the batch, the queue
    and the cores (``Settings.resolved_replica_threads``)."""
    values = settings.model_dump()
    values.update(
        engine_replicas=1,
        engine_process=True,
        max_batch_size=share(settings.max_batch_size, replicas, index),
        max_queue_size=max(1, share(settings.max_queue_size, replicas, index)),
        torch_threads=settings.resolved_replica_threads(replicas),
    )
    return Settings(**values)


class ReplicatedEngine:
    """``Engine``'s interface (``api.service.EngineLike``) over several engines."""

    def __init__(self, settings: Settings, replicas: Sequence[Replica]) -> None:
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.settings = settings
        self.replicas = list(replicas)
        self._outstanding = [0] * len(self.replicas)  # sequences sent, not yet answered
        self._inflight: dict[RequestIdentity, tuple[int, int]] = {}  # identity -> (replica, callers)
        self._next = itertools.count()  # round robin among equally loaded replicas

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplicatedEngine:
        """``settings.resolved_engine_replicas()`` engine processes (spawned at ``start``)."""
        from chunlian.engine.process import ProcessEngine

        n = settings.resolved_engine_replicas()
        return cls(settings, [ProcessEngine(replica_settings(settings, n, i)) for i in range(n)])

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def model_tag(self) -> str:
        return self.replicas[0].model_tag

    async def start(self) -> None:
        """Start every replica at once; if one fails, stop the others and raise its error."""
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        log.info("%d engine replicas running", len(self.replicas))

    async def stop(self) -> None:
        """Stop every replica (their pending requests fail with ``EngineStopped``)."""
        results = await asyncio.gather(*(r.stop() for r in self.replicas), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.error("stopping an engine replica failed: %r", r)

    @property
    def running(self) -> bool:
        return all(r.running for r in self.replicas)

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        for r in self.replicas:
            r.add_step_listener(fn)

    @property
    def stats(self) -> EngineStats:
        """The replicas' counters and gauges summed (read by the metrics at scrape time)."""
        total = EngineStats()
        for f in fields(EngineStats):
            setattr(total, f.name, sum(getattr(r.stats, f.name) for r in self.replicas))
        return total

    # ---- requests --------------------------------------------------------------------------
    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate on one replica (module docstring); raises what ``Engine.generate`` raises."""
        identity = req.identity()
        i = self._route(identity)
        seqs = req.params.n
        self._outstanding[i] += seqs
        if self.settings.coalesce:
            _, callers = self._inflight.get(identity, (i, 0))
            self._inflight[identity] = (i, callers + 1)
        try:
            return await self.replicas[i].generate(req)
        finally:
            self._outstanding[i] -= seqs
            if self.settings.coalesce:
                _, callers = self._inflight[identity]
                if callers <= 1:
                    del self._inflight[identity]
                else:
                    self._inflight[identity] = (i, callers - 1)

    def _route(self, identity: RequestIdentity) -> int:
        if self.settings.coalesce:
            same = self._inflight.get(identity)
            if same is not None and self.replicas[same[0]].running:
                return same[0]
        alive = [i for i, r in enumerate(self.replicas) if r.running]
        if not alive:
            raise E.EngineStopped("engine is not running")
        least = min(self._outstanding[i] for i in alive)
        tied = [i for i in alive if self._outstanding[i] == least]
        return tied[next(self._next) % len(tied)]

