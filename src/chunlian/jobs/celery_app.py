"""The Celery application: Redis as broker and result store, settings from ``CHUNLIAN_*``.

``make_celery(settings)`` builds an app (the API uses one to enqueue chunks);
``app`` (created on first access, from the environment) is the worker's:
``chunlian worker`` or ``python -m celery -A chunlian.jobs.celery_app worker``.

Delivery guarantees, and why each setting is there:

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only after
  its task returned; a worker process that dies mid-task gets its message requeued, and a
  whole worker that dies leaves it unacknowledged in Redis, where the next worker restores
  it once ``visibility_timeout`` has passed. Items are therefore run *at least* once; the
  store's first-write-wins results make them count *exactly* once.
* ``visibility_timeout`` is sized above everything a message can legitimately spend
  unacknowledged (the hard time limit plus the longest retry countdown), so a healthy
  slow task is never handed to a second worker.
* ``worker_prefetch_multiplier = 1``: a worker reserves one chunk per process, so chunks
  queued behind a slow one stay available to other workers (and are not lost with it).
* soft/hard time limits per task; the hard limit kills the process and the task's
  ``on_failure`` (run in the worker's main process) fails the chunk's unfinished items.
* ``result_expires`` = ``job_result_ttl_s`` (the job store's keys use the same TTL).
"""

from __future__ import annotations

import math
from typing import Any

from celery import Celery

from chunlian.config import Settings, load_settings
from chunlian.errors import ConfigError

TASK_NAME = "chunlian.jobs.run_chunk"
RETRY_BACKOFF_MAX_S = 60
MAX_COUNTDOWN_S = 4  # the longest retry countdown is 2 s (3 tries: 1 s, 2 s); with margin


def visibility_timeout_s(settings: Settings) -> float:
    """How long an unacknowledged message waits before another worker may take it."""
    floor = settings.job_hard_time_limit_s + MAX_COUNTDOWN_S
    if settings.job_visibility_timeout_s is None:
        return max(2 * settings.job_hard_time_limit_s, settings.job_hard_time_limit_s + 60)
    if settings.job_visibility_timeout_s <= floor:
        raise ConfigError(
            f"CHUNLIAN_JOB_VISIBILITY_TIMEOUT_S must exceed the hard time limit plus the longest "
            f"retry countdown ({floor:g} s), got {settings.job_visibility_timeout_s:g}"
        )
    return settings.job_visibility_timeout_s


def make_celery(settings: Settings, *, worker: bool = False) -> Celery:
    """A Celery app for ``settings.broker_url`` (``ConfigError`` when there is none)."""
    if not settings.broker_url:
        raise ConfigError("CHUNLIAN_BROKER_URL is not set (a redis:// URL): Celery needs a broker")
    visibility = visibility_timeout_s(settings)
    restore_every = max(1, min(10, math.floor(visibility / 4)))
    transport = {
        "visibility_timeout": visibility,
        "unacked_restore_interval": restore_every,  # sweep for abandoned messages this often
        "unacked_restore_throttle": 1,
        "socket_timeout": 30,
    }
    app = Celery("chunlian", broker=settings.broker_url, backend=settings.broker_url,
                 include=["chunlian.jobs.tasks"] if worker else [])
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_default_queue=settings.job_queue,
        task_routes={TASK_NAME: {"queue": settings.job_queue}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure=True,  # a failed chunk has recorded its items (on_failure)
        task_acks_on_timeout=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.job_soft_time_limit_s,
        task_time_limit=settings.job_hard_time_limit_s,
        task_ignore_result=True,  # results live in the job store; failures are still stored
        task_store_errors_even_if_ignored=True,
        result_expires=settings.job_result_ttl_s,
        broker_transport_options=transport,
        result_backend_transport_options={"visibility_timeout": visibility},
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_proc_alive_timeout=120,  # a pool process loads the model before it says UP
        worker_hijack_root_logger=False,
        task_track_started=False,
    )
    app.chunlian_settings = settings
    return app


_app: Celery | None = None


def get_app(settings: Settings | None = None) -> Celery:
    """The worker's app (created once): for ``settings`` (``chunlian worker``'s, its flags
    applied), else for the environment's."""
    global _app
    if _app is None:
        _app = make_celery(settings if settings is not None else load_settings(), worker=True)
    return _app


def __getattr__(name: str) -> Any:  # ``celery -A chunlian.jobs.celery_app`` looks up ``app``
    if name in ("app", "celery"):
        return get_app()
    raise AttributeError(name)
