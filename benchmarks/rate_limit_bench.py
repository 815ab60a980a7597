"""What nginx's per-client rate limit buys: one abusive client beside well-behaved users.

Side by side in one run, each phase on a fresh ``chunlian cluster`` (1 instance + nginx):

* **abuser**: one address (127.0.0.2) sending cache misses (unique upper lines) as fast as
  ``--abuse-concurrency`` connections allow;
* **users**: ``--users`` other addresses (127.0.0.3, ...), each sending one miss every
  ``--user-interval-s`` (open loop, jittered), like people pressing the campaign page's button.

Phase ``off``: no limit (the default). Phase ``on``: ``--client-rate`` / ``--client-burst``.
The users' latency and success share say whether one client can take the service from
everyone else. All of 127.0.0.0/8 is loopback on Linux, so the clients' distinct source
addresses never leave this machine. Prints one JSON object (and writes ``--out``).

    python benchmarks/rate_limit_bench.py [--duration 15] [--client-rate 2] [--client-burst 10]

Needs nginx (scripts/install-nginx.sh) and Redis (db 10, the instances' shared cache, is
flushed before each phase; cluster_bench uses it the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis

from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port

REDIS_URL = "redis://127.0.0.1:6379/10"
POOL = "春风花鸟山水云月江河日星天地人年福喜乐安康寿家国门庭梅兰竹菊松柏金玉财源瑞雪新岁"


class Tally:
    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.ok_ms: list[float] = []


def _upper(rng: random.Random) -> str:
    return "".join(rng.choice(POOL) for _ in range(7))


async def _one(client: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    t0 = time.perf_counter()
    try:
        r = await client.post("/v1/couplets", json={"upper": _upper(rng)})
        tally.status[str(r.status_code)] += 1
        if r.status_code == 200:
            tally.ok_ms.append((time.perf_counter() - t0) * 1000)
    except httpx.HTTPError as e:
        tally.status[type(e).__name__] += 1


def _client(url: str, source: str, connections: int) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=source,
                                         limits=httpx.Limits(max_connections=connections))
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=30.0)


async def _abuser(url: str, concurrency: int, stop_at: float, tally: Tally, seed: int) -> None:
    async with _client(url, "127.0.0.2", concurrency) as client:
        async def loop(i: int) -> None:
            rng = random.Random(f"abuser-{seed}-{i}")
            while time.monotonic() < stop_at:
                await _one(client, tally, rng)
        await asyncio.gather(*(loop(i) for i in range(concurrency)))


async def _user(url: str, index: int, interval_s: float, stop_at: float, tally: Tally, seed: int) -> None:
    rng = random.Random(f"user-{seed}-{index}")
    async with _client(url, f"127.0.0.{3 + index}", 2) as client:
        await asyncio.sleep(rng.uniform(0, interval_s))
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            await _one(client, tally, rng)
            await asyncio.sleep(max(0.0, interval_s * rng.uniform(0.8, 1.2) - (time.monotonic() - t0)))


def _summary(t: Tally, duration_s: float) -> dict[str, Any]:
    total = sum(t.status.values())
    lat = sorted(t.ok_ms)
    return {
        "requests": total, "status": dict(t.status),
        "ok_share": round(t.status["200"] / total, 3) if total else None,
        "ok_per_s": round(t.status["200"] / duration_s, 1),
        "ok_p50_ms": round(statistics.median(lat), 1) if lat else None,
        "ok_p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
    }


async def _phase(url: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    abuse, users = Tally(), Tally()
    stop_at = time.monotonic() + args.duration
    await asyncio.gather(_abuser(url, args.abuse_concurrency, stop_at, abuse, seed),
                         *(_user(url, i, args.user_interval_s, stop_at, users, seed) for i in range(args.users)))
    return {"abuser": _summary(abuse, args.duration), "users": _summary(users, args.duration)}


def run(limit_on: bool, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One phase on a fresh cluster. Its lines are its own (``seed``) and the shared cache
    is emptied first: a line answered in an earlier phase would come back as a cache hit."""
    redis.Redis.from_url(REDIS_URL).flushdb()
    options: dict[str, Any] = (
        {"client_rate_per_s": args.client_rate, "client_burst": args.client_burst} if limit_on else {})
    spec = ClusterSpec(instances=1, port=free_port(), redis_url=REDIS_URL, ready_timeout_s=180,
                       nginx_worker_processes="1", access_log=False, nginx_options=options,
                       env={"CHUNLIAN_WARMUP": "", "CHUNLIAN_LOG_LEVEL": "warning"})
    with Cluster(spec) as cluster:
        out = asyncio.run(_phase(cluster.url, args, seed))
    out["limit"] = (f"{args.client_rate:g} requests/s per address, burst {args.client_burst}"
                    if limit_on else "off")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--abuse-concurrency", type=int, default=32)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--user-interval-s", type=float, default=1.0)
    ap.add_argument("--client-rate", type=float, default=2.0)
    ap.add_argument("--client-burst", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs, alternated")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    phases = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        phases += [run(on, args, seed=len(phases) + k) for k, on in enumerate(order)]
    report = {"host": platform.processor() or platform.machine(), "duration_s": args.duration,
              "abuse_concurrency": args.abuse_concurrency, "users": args.users,
              "user_interval_s": args.user_interval_s, "phases": phases}
    text = json.dumps(report, ensure_ascii=False, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
