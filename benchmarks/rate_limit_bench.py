"""What nginx's per-client rate limit buys: one abusive client beside well-behaved users.

Side by side in one run, each phase on a fresh ``chunlian cluster`` (``--instances``, default 2, + nginx):

* **abuser**: one address (127.0.0.2) sending cache misses (unique upper lines) at
  ``--abuse-rate`` a second whatever the answers (open loop, in its own niced process: the
  same offered load, and about the same client CPU, whether it is served or refused);
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
import multiprocessing
import os
import platform
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from chunlian.bench.common import percentile
from chunlian.bench.plan import ENDPOINT
from chunlian.bench.rawhttp import RawConnection, encode_body
from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port
from chunlian.config import load_settings

REDIS_URL = "redis://127.0.0.1:6379/10"
TIMEOUT_S = 30.0
POOL = "春风花鸟山水云月江河日星天地人年福喜乐安康寿家国门庭梅兰竹菊松柏金玉财源瑞雪新岁"


class Tally:
    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.ok_ms: list[float] = []


def _body(rng: random.Random) -> bytes:
    return encode_body({"upper": "".join(rng.choice(POOL) for _ in range(7))})


async def _one(conn: RawConnection, tally: Tally, rng: random.Random) -> None:
    t0 = time.perf_counter()
    status, _cached = await conn.post(ENDPOINT, _body(rng))
    tally.status[status] += 1
    if status == "200":
        tally.ok_ms.append((time.perf_counter() - t0) * 1000)


async def _abuser(host: str, port: int, rate_per_s: float, max_in_flight: int, stop_at: float,
                  tally: Tally, seed: int) -> None:
    """Open loop: a request every 1/rate s whatever the answers (at most ``max_in_flight``
    outstanding, one keep-alive connection each), so the offered load is the same whether
    the requests are served, queued or refused."""
    rng = random.Random(f"abuser-{seed}")
    idle: list[RawConnection] = []
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        conn = idle.pop() if idle else RawConnection(host, port, TIMEOUT_S, source_host="127.0.0.2")
        try:
            await _one(conn, tally, rng)
        finally:
            idle.append(conn)
            slots.release()

    next_at = time.monotonic()
    while (now := time.monotonic()) < stop_at:
        if now < next_at:
            await asyncio.sleep(next_at - now)
        next_at += 1.0 / rate_per_s
        await slots.acquire()
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.close()


def _abuser_process(host: str, port: int, args: dict[str, Any], seed: int, out: Any) -> None:
    """The abuser in its own process (another machine, in real life), niced so that its
    client work competes as little as possible with the service on a small machine."""
    os.nice(10)
    tally = Tally()
    stop_at = time.monotonic() + args["duration"]
    asyncio.run(_abuser(host, port, args["abuse_rate"], args["abuse_max_in_flight"], stop_at, tally, seed))
    out.send((dict(tally.status), tally.ok_ms))
    out.close()


async def _user(host: str, port: int, index: int, interval_s: float, stop_at: float, tally: Tally,
                seed: int) -> None:
    rng = random.Random(f"user-{seed}-{index}")
    conn = RawConnection(host, port, TIMEOUT_S, source_host=f"127.0.0.{3 + index}")
    await asyncio.sleep(rng.uniform(0, interval_s))
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        await _one(conn, tally, rng)
        await asyncio.sleep(max(0.0, interval_s * rng.uniform(0.8, 1.2) - (time.monotonic() - t0)))
    conn.close()


def _summary(t: Tally, duration_s: float) -> dict[str, Any]:
    total = sum(t.status.values())
    lat = t.ok_ms
    return {
        "requests": total, "status": dict(t.status),
        "ok_share": round(t.status["200"] / total, 3) if total else None,
        "ok_per_s": round(t.status["200"] / duration_s, 1),
        "ok_p50_ms": round(statistics.median(lat), 1) if lat else None,
        "ok_p99_ms": round(percentile(lat, 99), 1) if lat else None,
    }


async def _users(host: str, port: int, args: argparse.Namespace, seed: int) -> Tally:
    users = Tally()
    stop_at = time.monotonic() + args.duration
    await asyncio.gather(*(_user(host, port, i, args.user_interval_s, stop_at, users, seed)
                           for i in range(args.users)))
    return users


def _phase(url: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_abuser_process, args=(host, int(port), vars(args), seed, send), daemon=True)
    proc.start()
    users = asyncio.run(_users(host, int(port), args, seed))
    status, ok_ms = recv.recv() if recv.poll(args.duration + 60) else ({"no report": 1}, [])
    proc.join(timeout=10)
    abuse = Tally()
    abuse.status.update(status)
    abuse.ok_ms = ok_ms
    return {"abuser": _summary(abuse, args.duration), "users": _summary(users, args.duration)}


def run(limit_on: bool, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One phase on a fresh cluster. Its lines are its own (``seed``) and the shared cache
    is emptied first: a line answered in an earlier phase would come back as a cache hit."""
    redis.Redis.from_url(REDIS_URL).flushdb()
    options: dict[str, Any] = (
        {"client_rate_per_s": args.client_rate, "client_burst": args.client_burst} if limit_on else {})
    spec = ClusterSpec(instances=args.instances, port=free_port(), redis_url=REDIS_URL, ready_timeout_s=180,
                       nginx_worker_processes="1", access_log=False, nginx_options=options,
                       env={"CHUNLIAN_WARMUP": "", "CHUNLIAN_LOG_LEVEL": "warning"})
    with Cluster(spec, load_settings(environ={**os.environ, **spec.env})) as cluster:
        out = _phase(cluster.url, args, seed)
    out["limit"] = (f"{args.client_rate:g} requests/s per address, burst {args.client_burst}"
                    if limit_on else "off")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--instances", type=int, default=2, help="behind nginx (chunlian cluster's default)")
    ap.add_argument("--abuse-rate", type=float, default=300.0, help="the abuser's requests a second (open loop)")
    ap.add_argument("--abuse-max-in-flight", type=int, default=256, help="the abuser's outstanding requests at most")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--user-interval-s", type=float, default=1.0)
    ap.add_argument("--client-rate", type=float, default=2.0)
    ap.add_argument("--client-burst", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs, alternated")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    phases: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        phases += [run(on, args, seed=len(phases) + k) for k, on in enumerate(order)]
    report = {"host": platform.processor() or platform.machine(), "duration_s": args.duration,
              "instances": args.instances, "abuse_rate_per_s": args.abuse_rate, "users": args.users,
              "user_interval_s": args.user_interval_s, "phases": phases}
    text = json.dumps(report, ensure_ascii=False, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
