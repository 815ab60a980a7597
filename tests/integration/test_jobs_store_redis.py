"""The Redis job store against the real Redis (db 11), held to the memory store's contract,
plus what only Redis has: a TTL on every key, and first-write-wins under concurrent writers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from chunlian.jobs.redis_store import RECENT_KEY, RedisJobStore, job_keys
from tests.unit.test_jobs_store import DONE, check_store_contract

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/11"


@pytest.fixture
def store() -> Iterator[tuple[RedisJobStore, str]]:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    s = RedisJobStore(REDIS_URL, ttl_s=600)
    prefix = f"t{uuid.uuid4().hex[:8]}-"  # only this run's keys are touched
    yield s, prefix
    keys = list(s.r.scan_iter(f"chunlian:job:{{{prefix}*", count=1000))
    if keys:
        s.r.delete(*keys)
    ours = [m for m in s.r.zrange(RECENT_KEY, 0, -1) if m.startswith(prefix)]
    if ours:
        s.r.zrem(RECENT_KEY, *ours)
    s.close()


def test_redis_store_contract(store: tuple[RedisJobStore, str]) -> None:
    check_store_contract(*store)


def test_every_key_has_the_ttl(store: tuple[RedisJobStore, str]) -> None:
    s, p = store
    s.create(f"{p}t", 3)
    s.begin_attempt(f"{p}t", [0])
    s.record(f"{p}t", [(0, DONE)])
    for key in job_keys(f"{p}t"):
        assert 0 < s.r.ttl(key) <= 600


def test_recent_forgets_expired_jobs(store: tuple[RedisJobStore, str]) -> None:
    s, p = store
    s.create(f"{p}old", 1)
    s.create(f"{p}new", 1)
    s.r.delete(job_keys(f"{p}old")[0])  # as its TTL would
    assert [st.job_id for st in s.recent(2)] == [f"{p}new"]
    assert s.r.zscore(RECENT_KEY, f"{p}old") is None and s.r.zscore(RECENT_KEY, f"{p}new") is not None
    assert 0 < s.r.ttl(RECENT_KEY) <= 600


def test_concurrent_writers_count_each_item_once(store: tuple[RedisJobStore, str]) -> None:
    s, p = store
    s.create(f"{p}c", 200)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            other = RedisJobStore(REDIS_URL, 600)
            for i in range(200):
                other.record(f"{p}c", [(i, DONE)])
            other.close()
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    st = s.state(f"{p}c")
    assert st is not None and st.done == 200 and st.status == "done"
    assert s.r.hlen(job_keys(f"{p}c")[1]) == 200
