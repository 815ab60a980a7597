"""The Redis cache through real HTTP and the real Redis (db 15): hits, TTL, regenerate,
and Redis stopped and restarted while the service keeps answering.

The in-process LRU is turned off (``cache_size=0``) so every hit here is a Redis hit.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from chunlian.config import load_settings
from tests.integration.live_server import LiveServer, model_path, serving
from tests.unit.test_api_metrics import sample

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REDIS_URL = "redis://127.0.0.1:6379/15"
TTL_S = 3600
KEY_RE = re.compile(r"chunlian:v1:[0-9a-f]{64}")
REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
]


def _redis() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, socket_timeout=2, decode_responses=True)


def _clean(r: redis.Redis) -> None:
    keys = list(r.scan_iter("chunlian:v1:*", count=1000))
    if keys:
        r.delete(*keys)


def _wait_for(pred, limit_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _pings() -> bool:
    try:
        return bool(_redis().ping())
    except redis.RedisError:
        return False


def _start_redis() -> None:
    if not _pings():
        subprocess.run(REDIS_START, check=True, capture_output=True, timeout=30)
    _wait_for(_pings, 30, "redis to answer")


@pytest.fixture(scope="module")
def rds() -> Iterator[redis.Redis]:
    if not _pings():
        pytest.skip("Redis is not running on 127.0.0.1:6379 (.ci/run starts it)")
    r = _redis()
    _clean(r)
    yield r
    _start_redis()
    _clean(_redis())


@pytest.fixture(scope="module")
def live(rds: redis.Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = load_settings(
        model_path=model_path(tmp_path_factory.mktemp("model")), device="cpu", max_batch_size=16,
        redis_url=REDIS_URL, cache_size=0, cache_ttl_s=TTL_S, warmup=(), torch_threads=1,
    )
    with serving(settings) as server:
        yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base_url, timeout=30) as c:
        yield c


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    return sample(client.get("/metrics").text, name, **labels)


def test_hit_on_repeat_comes_from_redis_with_ttl(client: httpx.Client, rds: redis.Redis) -> None:
    hits0 = metric(client, "chunlian_cache_requests_total", store="redis", result="hit")
    first = client.post("/v1/couplets", json={"upper": "春回大地千山秀"}).json()
    assert first["cached"] is False
    keys = list(rds.scan_iter("chunlian:v1:*"))
    assert len(keys) == 1 and KEY_RE.fullmatch(keys[0])  # no user text in key names
    assert 0 < rds.ttl(keys[0]) <= TTL_S
    assert "春回大地千山秀" in rds.get(keys[0])
    second = client.post("/v1/couplets", json={"upper": "春回大地千山秀"}).json()
    assert second["cached"] is True and second["lower"] == first["lower"]
    assert metric(client, "chunlian_cache_requests_total", store="redis", result="hit") == hits0 + 1
    assert metric(client, "chunlian_redis_up") == 1.0


def test_regenerate_bypasses_and_keeps_the_default(client: httpx.Client, rds: redis.Redis) -> None:
    default = client.post("/v1/couplets", json={"upper": "天增岁月人增寿"}).json()
    keys = set(rds.scan_iter("chunlian:v1:*"))
    stored = {k: rds.get(k) for k in keys}
    hits0 = metric(client, "chunlian_cache_requests_total", store="redis", result="hit")
    regen = client.post("/v1/couplets", json={"upper": "天增岁月人增寿", "regenerate": True}).json()
    assert regen["cached"] is False
    assert metric(client, "chunlian_cache_requests_total", store="redis", result="hit") == hits0  # no read
    assert set(rds.scan_iter("chunlian:v1:*")) == keys  # nothing written
    assert {k: rds.get(k) for k in keys} == stored
    again = client.post("/v1/couplets", json={"upper": "天增岁月人增寿"}).json()
    assert again["cached"] is True and again["lower"] == default["lower"]


def test_redis_stopped_and_restarted_while_serving(
    client: httpx.Client, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chunlian.cache.redis")
    uppers = ["一帆风顺年年好", "爆竹声声辞旧岁", "生意兴隆通四海", "万事如意步步高"]
    statuses: list[int] = []

    def ask(i: int) -> None:
        r = client.post("/v1/couplets", json={"upper": uppers[i % len(uppers)]})
        statuses.append(r.status_code)
        assert r.status_code == 200, r.text

    for i in range(4):
        ask(i)
    try:
        subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30)
        _wait_for(lambda: not _pings(), 30, "redis to stop")
        for i in range(12):  # served while Redis is gone: cache bypassed
            ask(i)
        assert metric(client, "chunlian_redis_up") == 0.0
        assert metric(client, "chunlian_cache_requests_total", store="redis", result="error") >= 1
    finally:
        _start_redis()
    misses0 = metric(client, "chunlian_cache_requests_total", store="redis", result="miss")

    def back() -> bool:
        ask(0)
        return metric(client, "chunlian_redis_up") == 1.0

    _wait_for(back, 30, "the service to reconnect to redis")
    for i in range(8):
        ask(i)
    assert metric(client, "chunlian_cache_requests_total", store="redis", result="miss") > misses0
    assert client.post("/v1/couplets", json={"upper": uppers[1]}).json()["cached"] is True
    assert set(statuses) == {200}
    lines = [r.getMessage() for r in caplog.records if r.name == "chunlian.cache.redis"]
    assert len([m for m in lines if "unreachable" in m]) == 1, lines
    assert len([m for m in lines if "reachable again" in m]) == 1, lines


def test_an_idle_upgrade_writes_the_best_answer_of_a_hot_line_to_redis(
    client: httpx.Client, rds: redis.Redis
) -> None:
    line = {"upper": "梅开五福迎新岁", "quality": "fast"}
    before = set(rds.scan_iter("chunlian:v1:*"))
    fast = client.post("/v1/couplets", json=line).json()
    assert fast["cached"] is False
    assert client.post("/v1/couplets", json=line).json()["cached"] is True  # asked twice, answered fast
    assert len(set(rds.scan_iter("chunlian:v1:*")) - before) == 1
    # the engine idles now: the line's best answer appears beside its fast one, in Redis
    _wait_for(lambda: len(set(rds.scan_iter("chunlian:v1:*")) - before) == 2, 60, "the upgraded answer")
    assert metric(client, "chunlian_idle_upgrades_total", outcome="upgraded") >= 1
    best = client.post("/v1/couplets", json=line).json()
    assert (best["served"], best["cached"]) == ("best", True)
    assert best["upper"] == fast["upper"] == "梅开五福迎新岁"
