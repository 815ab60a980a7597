"""What the campaign page costs the instances, with nginx's page cache on and off.

A campaign hour is mostly page loads: each visitor fetches ``/``, ``app.js``, ``style.css`` and
the icon before the first couplet request. ``chunlian cluster`` (one instance + nginx, the
shipped defaults otherwise) is started with ``--page-cache-s`` 60 and with 0 (off), alternately;
each phase sends ``--loads`` page loads from ``--concurrency`` keep-alive clients (the lean
raw client) and reads the CPU seconds the instance's process tree spent meanwhile
(``chunlian.bench.cpu``: the instance and its engine processes).

    python benchmarks/page_bench.py --loads 2000 --rounds 2

Reported per phase: page loads a second (the client, nginx and the instance share the
machine's cores), p50 of a load's four requests in sequence, and the instance's CPU
milliseconds per 1,000 loads: the cores a campaign's page traffic takes from generation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from chunlian.bench.cpu import CpuWindow
from chunlian.bench.rawhttp import RawConnection
from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port
from chunlian.config import load_settings

PAGE = ("/", "/static/app.js", "/static/style.css", "/static/favicon.svg")
REDIS_URL = "redis://127.0.0.1:6379/11"


async def _load(port: int, loads: int, concurrency: int) -> dict[str, Any]:
    todo = iter(range(loads))
    seconds: list[float] = []
    errors: dict[str, int] = {}

    async def client() -> None:
        conn = RawConnection("127.0.0.1", port, timeout_s=30.0)
        try:
            for _ in todo:
                t0 = time.perf_counter()
                for path in PAGE:
                    status, _body = await conn.get(path)
                    if status != 200:
                        errors[str(status)] = errors.get(str(status), 0) + 1
                seconds.append(time.perf_counter() - t0)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"loads": len(seconds), "loads_per_s": round(len(seconds) / wall, 1),
            "p50_ms": round(1000 * statistics.median(seconds), 2), "errors": errors}


def _phase(page_cache_s: int, loads: int, concurrency: int) -> dict[str, Any]:
    spec = ClusterSpec(instances=1, port=free_port(), redis_url=REDIS_URL, ready_timeout_s=180,
                       nginx_worker_processes="1", nginx_metrics_port=None,
                       nginx_options={"page_cache_s": page_cache_s})
    with Cluster(spec, load_settings(environ={**os.environ, **spec.env})) as cluster:
        pid = cluster.instances[0].pid
        asyncio.run(_load(spec.port, 50, 4))  # connections, the cache's first copy, the interpreter
        window = CpuWindow({"instance": [pid]})
        out = asyncio.run(_load(spec.port, loads, concurrency))
        cpu_s = window.read().seconds["instance"] or 0.0
        out["instance_cpu_ms_per_1000_loads"] = round(1e6 * cpu_s / max(1, out["loads"]), 1)
    out["page_cache_s"] = page_cache_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", type=int, default=2000, help="page loads per phase (4 requests each)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the JSON here too")
    args = ap.parse_args()
    if args.loads < 1 or args.concurrency < 1 or args.rounds < 1:
        ap.error(f"expected positive --loads, --concurrency and --rounds, got {args.loads}, "
                 f"{args.concurrency}, {args.rounds}")
    runs: dict[str, list[dict[str, Any]]] = {"cached": [], "off": []}
    for r in range(args.rounds):
        for name in ("cached", "off") if r % 2 == 0 else ("off", "cached"):
            runs[name].append(_phase(60 if name == "cached" else 0, args.loads, args.concurrency))
            print(name, runs[name][-1], file=sys.stderr, flush=True)
    report = {"meta": {**vars(args), "cpus": os.cpu_count()}, "runs": runs}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
