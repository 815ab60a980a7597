"""The idle upgrade: while the engine has nothing else to do, hot lines get the best mode.

Under load ``auto`` steps down to narrower searches and greedy decoding, and those answers
are cached: the lines asked most keep their weaker couplet for as long as the cache holds
it. ``IdleUpgrade`` spends the engine's idle time on them. Once the service has had no live
generation and the engine no queued or running request for ``idle_after_s``, it takes the
most asked hot line (``api.hotlines``), re-answers it in the best mode at bulk priority and
caches that answer under the best mode's key, in every store (in-process and Redis), where
every later lookup of the line, any quality, finds it first (``api.service.LOOKUP``).

It never delays a live request: one upgrade runs at a time, and it is cancelled, its rows
freed at the engine's next step, the moment a live generation starts in this service or
another request waits in the engine's queue beside the upgrade's own (jobs, another caller);
its line goes back to the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal

from chunlian.api.hotlines import HotLine, HotLines
from chunlian.api.service import CoupletService
from chunlian.errors import ChunlianError

log = logging.getLogger("chunlian.upgrade")

Outcome = Literal["upgraded", "yielded", "skipped", "failed"]
OutcomeHook = Callable[[Outcome], None]  # metrics
# how often a running upgrade checks the engine's queue (a live request of this service
# cancels it at once, without waiting for this)
POLL_S = 0.01


class IdleUpgrade:
    """Re-answers hot lines in the best mode while the engine idles (module docstring)."""

    def __init__(self, service: CoupletService, hot: HotLines, idle_after_s: float = 0.2,
                 on_outcome: OutcomeHook | None = None) -> None:
        if idle_after_s <= 0:
            raise ValueError(f"idle_after_s must be above 0, got {idle_after_s}")
        self.service = service
        self.hot = hot
        self.idle_after_s = idle_after_s
        self.on_outcome = on_outcome
        self._loop_task: asyncio.Task[None] | None = None
        self._upgrade: asyncio.Task[bool] | None = None
        service.on_live = self.give_way

    def start(self) -> None:
        """Run the upgrade loop as a task of the running event loop."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="chunlian-idle-upgrade")

    async def stop(self) -> None:
        """Stop the loop and any upgrade in flight (before the engine stops)."""
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def give_way(self) -> None:
        """A live generation starts: cancel the upgrade in flight, if any."""
        if self._upgrade is not None and not self._upgrade.done():
            self._upgrade.cancel()

    def _idle(self) -> bool:
        """No live generation for ``idle_after_s``, and nothing queued or running in the engine."""
        service, stats = self.service, self.service.engine.stats
        quiet_s = time.monotonic() - service.last_live_s
        return (service.live == 0 and quiet_s >= self.idle_after_s and stats.queue_depth == 0
                and stats.running == 0 and getattr(service.engine, "running", True))

    def _busy(self) -> bool:
        """Live work wants the engine: a live generation of this service, or a request
        queued beside the upgrade's own (which waits in the queue for its batch too: one)."""
        return self.service.live > 0 or self.service.engine.stats.queue_depth > 1

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.idle_after_s)
            try:
                line = self.hot.take() if self._idle() else None
                if line is not None:
                    self._report(await self._upgrade_one(line))
            except asyncio.CancelledError:
                raise
            except Exception:  # never the end of the loop (a stats read, a metrics hook)
                log.exception("idle upgrade loop error")

    async def _upgrade_one(self, line: HotLine) -> Outcome:
        """Upgrade ``line``, giving way to live work; what came of it."""
        self._upgrade = task = asyncio.ensure_future(self.service.upgrade(line.request))
        try:
            while not task.done():
                await asyncio.wait((task,), timeout=POLL_S)
                if not task.done() and self._busy():
                    task.cancel()
            try:
                done = task.result()
            except asyncio.CancelledError:
                self.hot.put_back(line)
                return "yielded"
            except ChunlianError as e:  # e.g. the engine stopping; the line is dropped
                log.info("idle upgrade of a hot line failed: %s", e)
                return "failed"
            except Exception:  # never the end of the loop
                log.exception("idle upgrade of a hot line failed")
                return "failed"
            return "upgraded" if done else "skipped"
        finally:
            if not task.done():  # the loop itself is cancelled (stop)
                task.cancel()
            self._upgrade = None

    def _report(self, outcome: Outcome) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)
