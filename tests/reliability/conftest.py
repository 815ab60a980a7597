"""Fixtures of the reliability suite (issue 9): real services over loopback, shared by the
whole session so that each starts once.

* ``main_service``: ``python -m chunlian.api`` in a child process with Redis (db 12) as
  its only cache, API keys, INFO logs captured to a file, a queue of 32,
  and Celery jobs without any worker (a fuzzed job is queued, never run).
* ``held_service``: the real app and engine in this process (uvicorn in a thread) with
  ``max_batch_size=1`` and a ``Hold`` on the engine, so a test can park the engine at a
  known point instead of racing it.

The scenarios themselves live in ``tests.reliability.harness``; the long versions run with
``scripts/reliability.sh`` (and here under ``-m slow``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live_server import model_path
from tests.reliability import harness as rel


def need(reason: str | None) -> None:
    """Skip (fail under CI) when a service this test needs is missing."""
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_path(tmp_path_factory.mktemp("reliability-model"))


@pytest.fixture(scope="session")
def redis_up() -> None:
    need(None if rel.redis_pings() else "Redis is not running on 127.0.0.1:6379 (scripts/ensure-redis.sh)")


@pytest.fixture(scope="session")
def main_service(weights: Path, redis_up: None) -> Iterator[rel.ServiceProcess]:
    queue = f"chunlian-rel-{uuid.uuid4().hex[:8]}"  # this test session's own job queue (no worker reads it)
    svc = rel.ServiceProcess({**rel.main_service_settings(queue), "model_path": weights}, "ci-main").start()
    try:
        yield svc
    finally:
        svc.cleanup()
        rel.start_redis()  # whatever a test did to it
        rel.drop_queue(queue)  # what else this leaves in db 12 expires (cache 1 h, jobs 10 min)


@pytest.fixture(scope="session")
def held_service(weights: Path) -> Iterator[rel.InProcessService]:
    svc = rel.InProcessService({"model_path": weights, "max_batch_size": 1, "max_queue_size": 64}).start()
    try:
        yield svc
    finally:
        svc.stop()
