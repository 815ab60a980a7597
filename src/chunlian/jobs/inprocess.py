"""Embedded jobs (no broker): items run as asyncio tasks on the API's own engine.

The same endpoints and the same store interface as Celery mode (``MemoryJobStore``), for
a single instance with no Redis. Items go through the service (cache first, then the
engine) at ``bulk`` priority, at most ``window`` (the engine's ``max_batch_size``) at once.
The pacing is the engine scheduler's alone (``engine.scheduler``): interactive requests
first, and bulk rows held to their share while interactive work runs, so interactive
traffic gets the engine back within one request's time and bulk keeps trickling.

Retries: a transient failure (queue full, deadline, a failed model step) is retried after
``2^n`` s (1, 2; 3 tries in all), a permanent one (bad input) fails the item at once.
Jobs live in this process: a restart loses them (use a broker for durable jobs).

Items marked for the quality mode (``jobs.items.searchable``) ask the engine for
``quality: "best"``: its searches run in the engine's search rows at bulk priority, beside
interactive work, under the same bulk share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from chunlian.errors import ChunlianError, InvalidInput, NotReady, Overloaded
from chunlian.jobs.items import CANCELLED_ENTRY, Spec, done_entry, failed_entry, request_of
from chunlian.jobs.store import JobState, MemoryJobStore
from chunlian.jobs.worker import MAX_TRIES

log = logging.getLogger("chunlian.jobs")


class InProcessJobs:
    """Jobs on this process's engine; ``service`` gives the ``CoupletService`` (or None
    while the instance is not ready)."""

    mode = "in-process"

    def __init__(self, service: Callable[[], Any], ttl_s: float, window: int = 16,
                 item_timeout_s: float = 60.0, backoff_s: float = 1.0) -> None:
        self.store = MemoryJobStore(ttl_s)
        self._service = service
        self._window: asyncio.Semaphore | None = None  # created on the event loop
        self.window = max(1, window)
        self.in_flight = 0  # bulk items of all jobs in the engine (or between tries) now
        self.item_timeout_s = item_timeout_s
        self.backoff_s = backoff_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # ---- the backend interface ------------------------------------------------------------
    async def submit(self, specs: list[Spec]) -> str:
        svc = self._service()
        if svc is None:
            raise NotReady("the service is loading the model or warming up; retry shortly")
        if self._window is None:
            self._window = asyncio.Semaphore(self.window)
        job_id = uuid.uuid4().hex
        self.store.create(job_id, len(specs))
        task = asyncio.get_running_loop().create_task(self._run(job_id, specs), name=f"job-{job_id}")
        self._tasks[job_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(job_id, None))
        return job_id

    async def state(self, job_id: str) -> JobState | None:
        return self.store.state(job_id)

    async def recent(self, limit: int) -> list[JobState]:
        return self.store.recent(limit)

    async def results(self, job_id: str, offset: int, limit: int) -> list[dict[str, Any]]:
        return self.store.results(job_id, offset, limit)

    async def cancel(self, job_id: str) -> JobState | None:
        state = self.store.cancel(job_id)
        task = self._tasks.get(job_id)
        if state is not None and state.cancel_requested and task is not None:
            task.cancel()  # items in the engine are cancelled too; they free their slots
        return state

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ---- running a job ----------------------------------------------------------------------
    async def _run(self, job_id: str, specs: list[Spec]) -> None:
        assert self._window is not None
        window = self._window
        running: set[asyncio.Task[None]] = set()
        try:
            for index, spec in enumerate(specs):
                await window.acquire()  # in order, at most ``window`` items in the engine
                if self.store.is_cancelled(job_id):
                    window.release()
                    break
                t = asyncio.ensure_future(self._item(job_id, index, spec))
                running.add(t)
                self.in_flight += 1

                def finished(t: asyncio.Task[None]) -> None:
                    running.discard(t)
                    self.in_flight -= 1
                    window.release()

                t.add_done_callback(finished)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        except asyncio.CancelledError:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        except Exception:  # never leave a job half-written without saying so
            log.exception("job %s failed", job_id)
            left = self.store.missing(job_id, range(len(specs)))
            self.store.record(job_id, [(i, failed_entry("internal", "the job runner failed"))
                                       for i in left])

    async def _generate(self, req: Any) -> Any:
        svc = self._service()
        if svc is None:
            raise NotReady("the service is not ready")
        return await svc.answer(req)

    async def _item(self, job_id: str, index: int, spec: Spec) -> None:
        req = request_of(spec, timeout_s=self.item_timeout_s)
        last = ""
        for attempt in range(1, MAX_TRIES + 1):
            if self.store.is_cancelled(job_id):
                self.store.record(job_id, [(index, CANCELLED_ENTRY)])
                return
            self.store.begin_attempt(job_id, [index])
            try:
                answer = await self._generate(req)
            except InvalidInput as e:
                self.store.record(job_id, [(index, failed_entry(e.code, e.message, e.field))])
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # transient: engine busy, deadline, a failed model step
                last = f"{type(e).__name__}: {e}" if not isinstance(e, ChunlianError) else f"{e.code}: {e}"
                if attempt == MAX_TRIES:
                    break
                delay = self.backoff_s * 2 ** (attempt - 1)
                if isinstance(e, Overloaded):
                    delay = max(delay, e.retry_after_s)
                await asyncio.sleep(delay)
                continue
            self.store.record(job_id, [(index, done_entry(answer.result, req.params.n))])
            return
        self.store.record(job_id, [(index, failed_entry("item_failed",
                                                        f"failed after {MAX_TRIES} tries: {last}"))])
