"""The Celery task: one chunk of a job (``chunlian.jobs.run_chunk(job_id, items)``).

Each worker *process* loads the model once, when it starts (``worker_process_init``),
and keeps it; tasks reuse it. With ``CHUNLIAN_WORKER_ENGINE_URL`` set, no model is loaded:
items go to that serving instance's engine over HTTP at ``bulk`` priority.

Retries: ``worker.RetryChunk`` (and a lost Redis connection) is retried automatically with
exponential backoff (``2^n`` s: 1, 2; no jitter), 3 tries in all; on the last try nothing is raised, the
items still failing are recorded as failed. ``on_failure`` runs whenever the task fails
for good, including in the worker's main process after the hard time limit killed the
pool process: it fails the chunk's unfinished items, so no item is left pending for ever.

Each chunk is marked running in the store while a worker holds it. A mark older than the
hard time limit (plus a margin) means its worker, or its message, was lost (a broker
restart can lose the message of the chunk in flight): ``CeleryJobs`` sends such a chunk
again when the job is polled (``backend.CeleryJobs.resend_stalled``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from celery import Task
from celery.exceptions import TimeLimitExceeded
from celery.signals import worker_process_init

from chunlian.jobs.celery_app import RETRY_BACKOFF_MAX_S, TASK_NAME, get_app
from chunlian.jobs.redis_store import RedisJobStore
from chunlian.jobs.worker import MAX_TRIES, Executor, RetryChunk, fail_remaining, process_chunk

log = logging.getLogger("chunlian.jobs")
app = get_app()

_store: RedisJobStore | None = None
_store_pid = 0
_executor: Executor | None = None


def store() -> RedisJobStore:
    """This process's job store (a fresh Redis client after a fork)."""
    global _store, _store_pid
    if _store is None or _store_pid != os.getpid():
        s = app.chunlian_settings
        _store, _store_pid = RedisJobStore(s.broker_url, s.job_result_ttl_s), os.getpid()
    return _store


def executor() -> Executor:
    """This process's executor: the model, loaded once (or the HTTP engine client)."""
    global _executor
    if _executor is None:
        from chunlian.jobs.worker import HttpExecutor, LocalExecutor

        s = app.chunlian_settings
        url = s.worker_engine_url
        if url:  # the instance's engine, at bulk priority: its scheduler keeps this
            # worker's rows to the bulk share while interactive requests run
            keys = sorted(s.api_key_set)
            _executor = HttpExecutor(url, s.max_batch_size, s.job_soft_time_limit_s,
                                     api_key=keys[0] if keys else None, blocklist=s.generation_blocklist())
            log.info("worker %d sends items to %s (%d at a time)", os.getpid(), url, s.max_batch_size)
        else:
            _executor = LocalExecutor.from_settings(s)
    return _executor


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _load_model(**_: Any) -> None:
    executor()


class ChunkTask(Task):  # type: ignore[misc]
    """Fails a chunk's unfinished items when the task fails for good (hard limit included)."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        try:
            job_id, items = (list(args) + [kwargs.get("job_id"), kwargs.get("items")])[:2]
            indices = [int(i) for i, _ in items]
        except (TypeError, ValueError):
            log.error("chunk task %s failed with unreadable arguments", task_id)
            return
        if isinstance(exc, TimeLimitExceeded):
            limit = app.chunlian_settings.job_hard_time_limit_s
            code, message = "time_limit", f"the task ran past its hard time limit ({limit:g} s) and was killed"
        else:
            code, message = "internal", f"the task failed: {type(exc).__name__}"
        n = fail_remaining(job_id, indices, store(), code, message)
        if indices:
            store().chunk_left(job_id, indices[0], finished=True)
        log.error("job %s: chunk task %s failed (%s); %d items failed", job_id, task_id, code, n)


@app.task(  # type: ignore[untyped-decorator]
    bind=True, base=ChunkTask, name=TASK_NAME,
    acks_late=True, reject_on_worker_lost=True,
    autoretry_for=(RetryChunk, redis.ConnectionError, redis.TimeoutError), retry_backoff=True, retry_backoff_max=RETRY_BACKOFF_MAX_S,
    retry_jitter=False, max_retries=MAX_TRIES - 1,
)
def run_chunk(self: Task, job_id: str, items: list[list[Any]]) -> dict[str, int]:
    final = self.request.retries >= (self.max_retries or 0)
    st, chunk = store(), int(items[0][0])
    st.chunk_running(job_id, chunk)  # cleared below; left set only if this process dies
    try:
        report = process_chunk(job_id, [(int(i), s) for i, s in items], st, executor,
                               final_attempt=final)
    except RetryChunk:
        st.chunk_left(job_id, chunk, finished=False)  # the retry's message holds it now
        raise
    st.chunk_left(job_id, chunk, finished=True)
    return {"done": report.done, "failed": report.failed, "cancelled": report.cancelled,
            "skipped": report.skipped}
