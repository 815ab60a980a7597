"""Graceful drain for real: ``python -m chunlian.api`` (what ``chunlian serve`` runs) under
steady load gets SIGTERM.

* alone: readiness fails at once, requests in flight at the signal all finish with 200, new
  work gets 503 ``shutting_down`` with ``Retry-After`` (or, once the process is gone, a
  refused connection), and the process exits 0 well within its drain limit;
* behind nginx (``chunlian cluster``'s config, two instances): clients see only 200s while one
  instance drains and exits 0 -- its refusals go on to the other.

Load: 8 clients, each sending cache misses (fresh seeds) back to back, some of them batches of
16, so that requests are in flight when the signal comes. Waits are bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port, http_status
from chunlian.config import load_settings
from tests.integration.live_server import model_path, nginx_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

UPPERS = ("春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海")
DRAIN_LIMIT_S = 30.0


def _env(weights: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNLIAN_")}
    env.update({"CHUNLIAN_MODEL_PATH": str(weights), "CHUNLIAN_DEVICE": "cpu", "CHUNLIAN_WARMUP": "",
                "CHUNLIAN_CACHE_SIZE": "0", "CHUNLIAN_TORCH_THREADS": "1", "CHUNLIAN_ENGINE_REPLICAS": "1",
                "CHUNLIAN_MAX_BATCH_SIZE": "32", "CHUNLIAN_LOG_LEVEL": "INFO",
                "CHUNLIAN_DRAIN_TIMEOUT_S": str(DRAIN_LIMIT_S), "PYTHONUNBUFFERED": "1", **extra})
    return env


@dataclass
class Sent:
    path: str
    t_send: float
    t_done: float
    status: int  # -1: no answer (connection refused or reset)
    code: str | None = None
    retry_after: str | None = None


class Load:
    """8 clients sending cache misses back to back until ``stop``; every request recorded."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[Sent] = []
        self.stop = asyncio.Event()
        self._seed = iter(range(10**6, 10**9))

    async def client(self, k: int) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                seed = next(self._seed)
                if k % 4 == 0:  # a batch of 16: ~16x a lone request's work
                    path, body = "/v1/couplets/batch", {"items": [{"upper": u, "seed": seed + i}
                                                                  for i, u in enumerate(UPPERS * 3 + UPPERS[:1])]}
                else:
                    path, body = "/v1/couplets", {"upper": UPPERS[seed % len(UPPERS)], "seed": seed}
                t0 = time.monotonic()
                try:
                    r = await c.post(path, json=body)
                except httpx.TransportError:
                    self.sent.append(Sent(path, t0, time.monotonic(), -1))
                    await asyncio.sleep(0.05)
                    continue
                code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
                self.sent.append(Sent(path, t0, time.monotonic(), r.status_code, code, r.headers.get("retry-after")))

    def in_flight_at(self, t: float) -> list[Sent]:
        return [s for s in self.sent if s.t_send < t < s.t_done]


def _run(coro: object) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh thread for a fresh loop
        pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


def _wait_ready(port: int, proc: subprocess.Popen[bytes], limit_s: float = 180.0) -> None:
    deadline = time.monotonic() + limit_s
    while http_status("127.0.0.1", port, "/readyz") != 200:
        assert proc.poll() is None, f"the instance exited with {proc.returncode}"
        assert time.monotonic() < deadline, "the instance was not ready in time"
        time.sleep(0.1)


async def _watch_readiness(port: int) -> list[tuple[float, int | None]]:
    """``GET /readyz`` back to back until nothing answers; (when, status) for each."""
    seen: list[tuple[float, int | None]] = []
    deadline = time.monotonic() + DRAIN_LIMIT_S + 30
    while time.monotonic() < deadline:
        status = await asyncio.to_thread(http_status, "127.0.0.1", port, "/readyz")
        seen.append((time.monotonic(), status))
        if status is None:
            break
        await asyncio.sleep(0.01)
    return seen


def test_sigterm_under_load_finishes_what_is_in_flight_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "instance.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "chunlian.api"], stdout=log, stderr=subprocess.STDOUT,
                            env=_env(model_path(tmp_path), CHUNLIAN_PORT=str(port)))
    try:
        _wait_ready(port, proc)
        load = Load(f"http://127.0.0.1:{port}")
        marks: dict[str, float] = {}
        readiness: list[tuple[float, int | None]] = []

        async def main() -> None:
            clients = [asyncio.create_task(load.client(k)) for k in range(8)]
            await asyncio.sleep(2.0)
            marks["sigterm"] = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            readiness.extend(await _watch_readiness(port))
            code = await asyncio.to_thread(proc.wait, DRAIN_LIMIT_S + 30)
            marks["exit"] = time.monotonic()
            marks["code"] = code
            await asyncio.sleep(0.2)  # a few refused connections after the exit, too
            load.stop.set()
            await asyncio.gather(*clients)

        _run(main())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    output = (tmp_path / "instance.log").read_text(errors="replace")
    assert marks["code"] == 0, output[-3000:]
    drain_s = marks["exit"] - marks["sigterm"]
    assert drain_s < DRAIN_LIMIT_S, output[-3000:]
    in_flight = load.in_flight_at(marks["sigterm"])
    assert len(in_flight) >= 4, len(in_flight)  # the load really was in flight
    failed = [s for s in in_flight if s.status != 200]
    assert failed == [], failed
    # /readyz: 200 only until the signal is handled, then 503 while the drain lasts, then
    # nothing (the listener is closed once what was in flight has finished)
    statuses = [status for _, status in readiness]
    draining = statuses[statuses.index(503):] if 503 in statuses else []
    assert draining and set(draining[:-1]) == {503} and draining[-1] is None, statuses
    assert set(statuses[:len(statuses) - len(draining)]) <= {200}, statuses
    not_ready_at = next(t for t, status in readiness if status == 503)
    assert not_ready_at < max(s.t_done for s in in_flight)  # it failed while work was in flight
    after = [s for s in load.sent if s.t_send > not_ready_at]
    refused = [s for s in after if s.status == 503]
    assert refused and all(s.code == "shutting_down" and s.retry_after == "1" for s in refused), after[:5]
    assert {s.status for s in after} <= {503, -1}, Counter(s.status for s in after)
    assert "drained in" in output
    print(f"\ndrain alone: {len(in_flight)} in flight at SIGTERM, {len(failed)} failed; "
          f"{len(refused)} new requests refused with 503; /readyz 503 {len(draining) - 1} times, "
          f"then closed; exit 0 after {drain_s:.2f} s")


def test_one_of_two_instances_drains_behind_nginx_and_clients_see_only_200(tmp_path: Path) -> None:
    nginx_or_skip()
    env = _env(model_path(tmp_path))
    spec = ClusterSpec(instances=2, port=free_port(), redis_url="redis://127.0.0.1:6379/12", torch_threads=1,
                       nginx_worker_processes="1", nginx_metrics_port=None, ready_timeout_s=180,
                       env={k: v for k, v in env.items() if k.startswith("CHUNLIAN_")})
    with Cluster(spec, load_settings(environ={**os.environ, **spec.env})) as cluster:
        victim, survivor = cluster.instances
        load = Load(cluster.url)
        marks: dict[str, float] = {}

        async def main() -> None:
            clients = [asyncio.create_task(load.client(k)) for k in range(8)]
            await asyncio.sleep(2.0)
            marks["sigterm"] = time.monotonic()
            victim.proc.send_signal(signal.SIGTERM)
            marks["code"] = await asyncio.to_thread(victim.proc.wait, DRAIN_LIMIT_S + 30)
            marks["exit"] = time.monotonic()
            await asyncio.sleep(2.0)  # and on, on the survivor alone
            load.stop.set()
            await asyncio.gather(*clients)

        _run(main())
        assert survivor.alive
    assert marks["code"] == 0, victim.log_tail(40)
    statuses = Counter(s.status for s in load.sent)
    assert statuses == {200: len(load.sent)}, statuses
    in_flight = load.in_flight_at(marks["sigterm"])
    assert len(in_flight) >= 4
    print(f"\ndrain behind nginx: {len(load.sent)} requests, all 200; {len(in_flight)} in flight at SIGTERM; "
          f"the instance exited 0 after {marks['exit'] - marks['sigterm']:.2f} s")
