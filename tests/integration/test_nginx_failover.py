"""nginx never answers "no live upstreams" while an instance is up.

nginx OSS marks an upstream server failed, per nginx worker, for ``fail_timeout`` after
``max_fails`` failures. With every instance marked at once (an outside probe while none
listened yet, a brief restart of all of them) a worker used to answer its own 503 for those
seconds although the instances were serving again. Each instance is now also a backup that
is never marked failed (``nginx.conf.template``), so:

* a front whose instances all refused (and are marked for 60 s) serves 200s as soon as they
  listen;
* ``chunlian cluster`` probed through nginx from outside during its start-up answers 200
  sequential requests right after "ready" with 200 200s;
* SIGKILLing one of two instances under steady load: while the other is up, no client sees a
  5xx from nginx.

Everything is real (nginx, instances, Redis db 12) on loopback; waits are bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port, http_status
from chunlian.config import load_settings
from tests.integration.live_server import LiveServer, model_path, nginx_front, nginx_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REDIS_URL = "redis://127.0.0.1:6379/12"
UPPERS = ("春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海")


def _statuses(url: str, n: int) -> Counter[int]:
    """``n`` sequential couplet requests, each on a new connection (separate clients)."""
    seen: Counter[int] = Counter()
    with httpx.Client(base_url=url, timeout=60) as c:
        for k in range(n):
            r = c.post("/v1/couplets", json={"upper": UPPERS[k % len(UPPERS)]}, headers={"Connection": "close"})
            seen[r.status_code] += 1
    return seen


def test_instances_that_all_refused_are_used_as_soon_as_they_listen(tmp_path: Path) -> None:
    """Both instances refuse (bound, not yet listening), so the front's one worker marks both
    failed for 60 s; once they listen, every request is answered by them."""
    weights = model_path(tmp_path / "model")
    servers = [LiveServer(load_settings(model_path=weights, device="cpu", torch_threads=1, engine_replicas=1,
                                        warmup=(), cache_size=0, instance_id=f"refused-{k}"))
               for k in (1, 2)]
    try:
        with nginx_front(tmp_path, [s.port for s in servers], fail_timeout_s=60) as front:
            with httpx.Client(base_url=front.url, timeout=30) as c:
                r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
            error_log = (front.cfg.prefix / "logs" / "error.log").read_text()
            assert error_log.count("Connection refused") >= 2, error_log  # both primaries marked
            for s in servers:
                s.start()
            for s in servers:
                s.wait_ready()
            assert _statuses(front.url, 200) == {200: 200}
            seen: set[str] = set()
            with httpx.Client(base_url=front.url, timeout=30) as c:
                for _ in range(6):
                    seen.add(c.get("/readyz", headers={"Connection": "close"}).headers["x-chunlian-instance"])
            assert seen == {"refused-1", "refused-2"}  # both serve, marked or not
    finally:
        for s in servers:
            if s.server.started:
                s.stop()


# ---- chunlian cluster, probed from outside during its start-up ------------------------------------
@dataclass
class Probe:
    """An outside readiness probe through nginx (a load balancer's health check)."""

    port: int
    stop: threading.Event = field(default_factory=threading.Event)
    statuses: Counter[int] = field(default_factory=Counter)

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.statuses[http_status("127.0.0.1", self.port, "/readyz", timeout=1.0) or 0] += 1


@pytest.fixture(scope="module")
def probed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Probe]]:
    nginx_or_skip()
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).flushdb()
    except redis.RedisError as e:
        if os.environ.get("CI"):
            pytest.fail(f"Redis is not reachable at {REDIS_URL}: {e}")
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {e}")
    weights = model_path(tmp_path_factory.mktemp("model"))
    env = {"CHUNLIAN_MODEL_PATH": str(weights), "CHUNLIAN_DEVICE": "cpu", "CHUNLIAN_WARMUP": "",
           "CHUNLIAN_MAX_BATCH_SIZE": "16", "CHUNLIAN_LOG_LEVEL": "WARNING", "CHUNLIAN_CACHE_SIZE": "0"}
    spec = ClusterSpec(instances=2, port=free_port(), redis_url=REDIS_URL, torch_threads=1,
                       nginx_worker_processes="2", nginx_metrics_port=None, ready_timeout_s=180, env=env)
    probe = Probe(spec.port)
    thread = threading.Thread(target=probe.run, daemon=True)
    thread.start()  # before nginx or any instance exists
    try:
        with Cluster(spec, load_settings(environ={**os.environ, **spec.env})) as cluster:
            probe.stop.set()
            yield cluster, probe
    finally:
        probe.stop.set()
        thread.join(timeout=5)


def test_200_sequential_requests_right_after_ready_are_all_answered(
        probed_cluster: tuple[Cluster, Probe]) -> None:
    cluster, probe = probed_cluster
    assert _statuses(cluster.url, 200) == {200: 200}
    # the probe did see the instances unreachable (nginx's 503) while they started
    assert probe.statuses[503] > 0, probe.statuses


def test_sigkill_of_one_instance_under_steady_load_shows_no_5xx(probed_cluster: tuple[Cluster, Probe]) -> None:
    cluster, _ = probed_cluster
    victim, survivor = cluster.instances
    results: list[tuple[float, int, str]] = []  # seconds since the start, status, instance
    stop = asyncio.Event()
    seed = iter(range(10**6, 10**9))

    async def client(c: httpx.AsyncClient) -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            # fresh seeds: cache misses keep requests in flight on both instances
            r = await c.post("/v1/couplets", json={"upper": UPPERS[0], "seed": next(seed)})
            results.append((time.monotonic() - t0, r.status_code, r.headers.get("x-chunlian-instance", "nginx")))

    async def main() -> None:
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60, limits=limits) as c:
            load = [asyncio.create_task(client(c)) for _ in range(4)]
            await asyncio.sleep(3)
            victim.signal_group(signal.SIGKILL)
            # long enough for nginx's failure marks on the victim (5 s) to expire and be set again
            await asyncio.sleep(12)
            stop.set()
            await asyncio.gather(*load)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result()
    assert victim.proc.wait(timeout=10) == -signal.SIGKILL
    assert survivor.alive
    by_status = Counter(s for _, s, _ in results)
    assert not [r for r in results if r[1] >= 500], by_status
    assert by_status[200] == len(results) and len(results) >= 20, by_status
    late = [inst for t, _, inst in results if t > 5]  # well after the kill: the survivor only
    assert late and set(late) == {survivor.instance_id}, Counter(late)
