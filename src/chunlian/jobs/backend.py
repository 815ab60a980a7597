"""The API's view of jobs: one interface, two backends.

* ``CeleryJobs`` (``CHUNLIAN_BROKER_URL`` set): the job goes into the Redis store, its
  items into Celery tasks of ``job_chunk_size`` items on ``job_queue``; ``chunlian worker``
  processes run them. The API needs no model for this.
* ``InProcessJobs`` (the embedded default): asyncio tasks on this instance's engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from chunlian.config import Settings
from chunlian.errors import EngineStopped
from chunlian.jobs.items import Spec, failed_entry
from chunlian.jobs.redis_store import RedisJobStore
from chunlian.jobs.store import JobState

log = logging.getLogger("chunlian.jobs")
T = TypeVar("T")
SWEEP_EVERY_S = 5.0  # per job, when polled
STALL_MARGIN_S = 30.0  # beyond the hard time limit: a chunk running this long has lost its worker


class JobsBackend(Protocol):
    mode: str

    async def submit(self, specs: list[Spec]) -> str: ...
    async def state(self, job_id: str) -> JobState | None: ...
    async def results(self, job_id: str, offset: int, limit: int) -> list[dict[str, Any]]: ...
    async def cancel(self, job_id: str) -> JobState | None: ...
    async def recent(self, limit: int) -> list[JobState]: ...
    async def close(self) -> None: ...


def chunks(specs: list[Spec], size: int) -> list[list[list[Any]]]:
    """``[[index, spec], ...]`` lists of at most ``size`` items, in order."""
    indexed = [[i, s] for i, s in enumerate(specs)]
    return [indexed[k:k + size] for k in range(0, len(indexed), size)]


class CeleryJobs:
    """Jobs in Redis, items run by Celery workers."""

    mode = "celery"

    def __init__(self, settings: Settings) -> None:
        from chunlian.jobs.celery_app import make_celery

        assert settings.broker_url
        self.settings = settings
        self.celery = make_celery(settings)
        self.store = RedisJobStore(settings.broker_url, settings.job_result_ttl_s)
        self._swept: dict[str, float] = {}

    def _submit(self, specs: list[Spec]) -> str:
        from chunlian.jobs.celery_app import TASK_NAME

        job_id = uuid.uuid4().hex
        self.store.create(job_id, len(specs))
        parts = chunks(specs, self.settings.job_chunk_size)
        self.store.save_chunks(job_id, parts)
        sent = 0
        try:
            with self.celery.producer_or_acquire() as producer:
                for part in parts:
                    self.celery.send_task(TASK_NAME, args=[job_id, part], queue=self.settings.job_queue,
                                          producer=producer)
                    sent += 1
        except Exception as e:
            log.exception("job %s: enqueueing failed after %d of %d chunks", job_id, sent, len(parts))
            try:  # the chunks that did not go out will never run: fail their items
                self.store.record(job_id, [
                    (int(i), failed_entry("engine_stopped", "the job queue was unavailable"))
                    for part in parts[sent:] for i, _ in part])
            except Exception:
                log.exception("job %s: could not record the unqueued items", job_id)
            if sent == 0:
                raise EngineStopped(f"the job queue is unavailable ({type(e).__name__})") from None
        return job_id

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        import redis

        try:
            return await asyncio.to_thread(fn, *args)
        except redis.RedisError as e:
            log.warning("job store unavailable: %s", e)
            raise EngineStopped(f"the job store is unavailable ({type(e).__name__})") from None

    async def submit(self, specs: list[Spec]) -> str:
        return await self._call(self._submit, specs)

    def _state(self, job_id: str) -> JobState | None:
        st = self.store.state(job_id)
        if st is not None and not st.finished and not st.cancel_requested:
            self.resend_stalled(job_id)
        return st

    def resend_stalled(self, job_id: str) -> int:
        """Send again every chunk marked running for longer than the hard time limit plus a
        margin that still has items without a result: its worker died, or its message was
        lost (a broker restart can lose the message of the chunk in flight). At most once
        per ``SWEEP_EVERY_S`` per job; a chunk that runs twice counts each item once."""
        from chunlian.jobs.celery_app import TASK_NAME

        now = time.monotonic()
        if now - self._swept.get(job_id, -1e9) < SWEEP_EVERY_S:
            return 0
        self._swept[job_id] = now
        if len(self._swept) > 10_000:
            self._swept.clear()
        stale_after = self.settings.job_hard_time_limit_s + STALL_MARGIN_S
        sent = 0
        for part in self.store.claim_stalled_chunks(job_id, stale_after):
            indices = [int(i) for i, _ in part]
            if not self.store.missing(job_id, indices):
                self.store.chunk_left(job_id, indices[0], finished=True)
                continue
            self.celery.send_task(TASK_NAME, args=[job_id, part], queue=self.settings.job_queue)
            sent += 1
            log.warning("job %s: chunk %d ran for over %.0f s without finishing (worker or message "
                        "lost); sent again", job_id, indices[0], stale_after)
        return sent

    async def state(self, job_id: str) -> JobState | None:
        return await self._call(self._state, job_id)

    async def results(self, job_id: str, offset: int, limit: int) -> list[dict[str, Any]]:
        return await self._call(self.store.results, job_id, offset, limit)

    async def cancel(self, job_id: str) -> JobState | None:
        return await self._call(self.store.cancel, job_id)

    async def recent(self, limit: int) -> list[JobState]:
        return await self._call(self.store.recent, limit)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)


def build_jobs(settings: Settings, service: Any) -> JobsBackend:
    """Celery when a broker is configured, else in-process on ``service()``'s engine."""
    if settings.broker_url:
        return CeleryJobs(settings)
    from chunlian.jobs.inprocess import InProcessJobs

    return InProcessJobs(service, settings.job_result_ttl_s, window=settings.max_batch_size,
                         item_timeout_s=settings.job_hard_time_limit_s)
