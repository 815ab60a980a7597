"""A fake engine and an in-process app harness for the API unit tests (no torch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from chunlian.api import create_app
from chunlian.api.runtime import Runtime
from chunlian.config import Settings, load_settings
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.engine.tiers import fixed_tier
from chunlian.errors import EngineStopped
from chunlian.types import Couplet, CoupletRequest, CoupletResult, Served


def _han(i: int) -> str:
    return chr(0x4E00 + 100 + (i % 5000))


class FakeEngine:
    """Answers at once with a deterministic couplet; errors and gates on demand."""

    model_tag = "fake-couplet@test"
    search_tag = "fake-couplet@rev-test"

    def __init__(self) -> None:
        self.stats = EngineStats(max_queue_size=8)
        self.calls: list[CoupletRequest] = []
        self.started = False
        self.stopped = False
        self.start_gate: asyncio.Event | None = None
        self.hold: asyncio.Event | None = None  # generate() waits on it when set
        self.fail: dict[str, BaseException] = {}  # text (upper/keyword/heads) -> error
        self.cancelled = 0
        self.auto_serves: Served = "best"  # the mode an auto request gets (the load's choice)
        self._listeners: list[Callable[[Any], None]] = []

    async def start(self) -> None:
        if self.start_gate is not None:
            await self.start_gate.wait()
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def add_step_listener(self, fn: Callable[[Any], None]) -> None:
        self._listeners.append(fn)

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        if not self.started or self.stopped:
            raise EngineStopped("engine is not running")
        self.calls.append(req)
        text = req.upper or req.keyword or req.heads or ""
        if text in self.fail:
            raise self.fail[text]
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        for fn in self._listeners:
            fn(StepReport(batch_size=1, step_s=0.002, tokens=7))
        self.stats.completed += 1
        self.stats.tokens_total += 7
        self.stats.steps_total += 1
        served = self.served(req)
        cands = tuple(self._couplet(req, c, served) for c in range(req.params.n))
        return CoupletResult(best=cands[0], candidates=cands if req.params.n > 1 else (),
                             model=self.model_tag, served=served)

    def served(self, req: CoupletRequest) -> Served:
        """As the engine decides it (``engine.tiers.fixed_tier``), auto as ``auto_serves``."""
        return fixed_tier(req, searching=True) or self.auto_serves

    def _couplet(self, req: CoupletRequest, c: int, served: Served = "fast") -> Couplet:
        # each mode writes its own lines, so a test can tell whose answer came back
        salt = (req.params.seed or 0) + c + {"best": 1000, "good": 500, "fast": 0}[served]
        if req.upper is not None:
            upper = req.upper
        else:
            length = req.length or 7
            head = req.heads[0] if req.heads else (req.keyword or "")
            upper = (head + "春" * length)[:length]
        lower = "".join(_han(ord(ch) + salt) for ch in upper)
        if req.heads and len(req.heads) > 1:  # the name's second head opens the 下联
            lower = req.heads[1] + lower[1:]
        return Couplet(upper=upper, lower=lower, hengpi="万象更新", style=req.style)


def unit_settings(**overrides: object) -> Settings:
    # gc_freeze off: a test process builds many apps, and frozen garbage is never collected
    # idle_upgrade off: its engine calls would join the ones a test counts (test_idle_upgrade turns it on)
    base: dict[str, object] = {"warmup": "", "instance_id": "unit-1", "body_limit_bytes": 4096, "gc_freeze": False,
                               "idle_upgrade": False}
    base.update(overrides)
    return load_settings(**base)


@dataclass
class Harness:
    client: httpx.AsyncClient
    engine: FakeEngine
    runtime: Runtime
    app: Any


@asynccontextmanager
async def running_app(
    engine: FakeEngine | None = None, wait_ready: bool = True, **overrides: object
) -> AsyncIterator[Harness]:
    """The app with its lifespan running, and an HTTP client talking to it in-process."""
    engine = engine or FakeEngine()
    app = create_app(unit_settings(**overrides), engine=engine)
    runtime = app.state.runtime
    async with app.router.lifespan_context(app):
        if wait_ready:
            await asyncio.wait_for(runtime.wait_ready(), 10)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://unit") as client:
            yield Harness(client, engine, runtime, app)
