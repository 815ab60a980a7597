"""Graceful drain of one instance on SIGTERM (or SIGINT), as orchestrators expect.

On the first signal:
1. readiness fails at once (``/readyz`` 503 ``shutting_down``, ``chunlian_ready`` 0), so a
   load balancer, nginx or Kubernetes stops sending work here;
2. new ``/v1/`` requests are refused with 503 ``shutting_down`` and ``Retry-After: 1``
   (nginx sends a refused idempotent request on to another instance); every answer from
   then on carries ``Connection: close``, so keep-alive connections wind down;
3. requests already in flight finish: they are bounded by their own deadlines, and the
   wait by ``CHUNLIAN_DRAIN_TIMEOUT_S``;
4. then uvicorn stops (listener closed, idle connections closed, lifespan shutdown: the
   engine stops) and the process exits 0.

A second signal ends the wait at once (step 4 still runs); a third stops without it.
``/healthz`` keeps answering 200 throughout: the process is alive, only leaving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

log = logging.getLogger("chunlian.api")

DRAIN_PREFIX = "/v1/"  # new work; the page, health, readiness and metrics keep answering


class Drain:
    """Whether this instance is leaving, and how many requests it is still answering."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self.started_at: float | None = None

    def begin(self) -> bool:
        """Start draining; False when it had already started."""
        if self.draining:
            return False
        self.draining = True
        self.started_at = time.monotonic()
        return True

    def refuses(self, path: str) -> bool:
        """Whether a new request for ``path`` is refused now."""
        return self.draining and path.startswith(DRAIN_PREFIX)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM/SIGINT drains first (module docstring) and exits 0.

    uvicorn's own handler stops accepting at once and, after shutting down, raises the
    signal again with its default action, so the process ends killed by it (status 143)
    instead of exiting 0; this handler does neither."""

    def __init__(self, config: uvicorn.Config, drain: Drain, on_drain: Callable[[], None],
                 limit_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.on_drain = on_drain
        self.limit_s = limit_s
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1 and self.started and self._loop is not None:
            self._loop.call_soon_threadsafe(self._start)
            return
        if self.signals >= 3:
            self.force_exit = True
        self.should_exit = True  # before the port opened, or a second signal: stop waiting

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run_drain())

    async def run_drain(self) -> None:
        """Steps 1-3, then ask uvicorn to stop."""
        if self.drain.begin():
            self.on_drain()
        t0 = time.monotonic()
        log.info("draining: not ready, new work refused with 503; %d request(s) in flight "
                 "(waiting up to %g s)", self.drain.in_flight, self.limit_s)
        while self.drain.in_flight > 0 and not self.should_exit and time.monotonic() - t0 < self.limit_s:
            await asyncio.sleep(0.02)
        left = self.drain.in_flight
        log.info("drained in %.2f s%s", time.monotonic() - t0,
                 f"; {left} request(s) still in flight are stopped with the engine" if left else "")
        self.should_exit = True

