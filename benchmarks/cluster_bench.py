"""Scale-out on this machine, measured side by side in one run; prints one JSON object.

1. Cache-miss throughput through nginx: 1 instance (torch threads = all cores), 1 instance
   (1 thread) and N instances (cores // N threads each) — unique upper lines, concurrency 32,
   ~20 s each. The CPU seconds of each role's process trees (instances, nginx, this load
   generator; ``chunlian.bench.cpu``) say where the cores went.
2. The overhead of nginx itself: one instance, cache-hit requests (one primed upper line),
   direct to the instance vs through nginx, alternated twice; ratio of throughputs and the
   latency nginx adds. Also nginx's own ceiling (``/nginx-health``, answered by nginx alone).

    python benchmarks/cluster_bench.py [--duration 20] [--concurrency 32] [--out FILE]

Needs nginx (scripts/install-nginx.sh) and Redis; uses Redis db 10 (flushed at start; no
other suite uses it).
The load generator is ``chunlian.bench.rawhttp.RawConnection`` (keep-alive HTTP/1.1 on asyncio
streams), so that the client costs as little CPU as possible on a small machine (it still
shares the cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chunlian.bench.common import percentile
from chunlian.bench.cpu import CLIENT, HOST, OTHER, CpuWindow, wait_quiet
from chunlian.bench.rawhttp import EXCHANGE_ERRORS, RawConnection
from chunlian.cluster.launcher import Cluster, ClusterSpec
from chunlian.cluster.procs import free_port
from chunlian.config import load_settings

REDIS_URL = "redis://127.0.0.1:6379/10"
ROOT = Path(__file__).resolve().parents[1]
HIT_UPPER = "春回大地千山秀"
TIMEOUT_S = 120.0  # one request; a cache miss on a busy 2-core host takes seconds
QUIET_CORES = 0.25  # a machine is quiet enough to measure below this many busy cores


# ---- load generator ----------------------------------------------------------------------------
class Stats:
    def __init__(self) -> None:
        self.lat: list[float] = []
        self.status: Counter[int] = Counter()
        self.instances: Counter[str] = Counter()
        self.cached: Counter[bool] = Counter()
        self.errors: Counter[str] = Counter()
        self.non200: list[dict[str, Any]] = []  # a few samples, to tell who answered what


async def _connection(host: str, port: int, make: Callable[[], tuple[str, str, bytes]],
                      stop_at: float, stats: Stats, record_from: float) -> None:
    conn = RawConnection(host, port, TIMEOUT_S)
    while time.perf_counter() < stop_at:
        method, path, body = make()
        t0 = time.perf_counter()
        try:
            status, headers, payload = await conn.request(method.encode(), path, body)
        except EXCHANGE_ERRORS as e:
            stats.errors[type(e).__name__] += 1
            await asyncio.sleep(0.05)
            continue
        t1 = time.perf_counter()
        if t0 >= record_from:
            stats.lat.append(t1 - t0)
            stats.status[status] += 1
            stats.instances[headers.get("x-chunlian-instance", "nginx")] += 1
            if status == 200 and path.startswith("/v1/"):
                stats.cached[b'"cached":true' in payload] += 1
            elif status != 200 and len(stats.non200) < 5:
                stats.non200.append({"status": status, "by": headers.get("x-chunlian-instance", "nginx"),
                                     "request_id": headers.get("x-request-id"),
                                     "body": payload[:200].decode("utf-8", "replace")})
    conn.close()



def _cluster(spec: ClusterSpec) -> Cluster:
    """A cluster of ``spec`` whose instances read this environment and ``spec.env``."""
    return Cluster(spec, load_settings(environ={**os.environ, **spec.env}))

def load(url: str, make: Callable[[], tuple[str, str, bytes]], concurrency: int, duration: float,
         warm_s: float = 2.0) -> Stats:
    """``concurrency`` keep-alive connections sending ``make()`` requests for ``warm_s +
    duration`` seconds; only the last ``duration`` seconds are recorded."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    stats = Stats()

    async def main() -> None:
        start = time.perf_counter()
        stop_at = start + warm_s + duration
        await asyncio.gather(*(_connection(host, int(port), make, stop_at, stats, start + warm_s)
                               for _ in range(concurrency)))

    asyncio.run(main())
    return stats


def summary(stats: Stats, duration: float) -> dict[str, Any]:
    lat = stats.lat
    ok = stats.status.get(200, 0)

    def pct(p: float) -> float | None:
        return round(percentile(lat, p) * 1000, 2) if lat else None

    return {
        "rps": round(ok / duration, 1),
        "requests": len(lat),
        "ok": ok,
        "status": dict(stats.status),
        "errors": dict(stats.errors),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "by_instance": dict(stats.instances),
        "cached": {str(k).lower(): v for k, v in stats.cached.items()},
        "non_200_samples": stats.non200,
    }


# ---- CPU accounting ----------------------------------------------------------------------------
def cpu_window(cluster: Cluster) -> CpuWindow:
    """CPU seconds per role over a window (``bench.cpu``): the instances' process trees (their
    engine processes included), nginx's (master and workers, and its exporter), the Celery
    workers', and this process (``client``)."""
    roles: dict[str, list[int]] = {"instances": [], "nginx": [], "workers": []}
    for c in cluster.children:
        roles[{"instance": "instances", "worker": "workers"}.get(c.role, "nginx")].append(c.pid)
    return CpuWindow(roles)


def cores_used(window: CpuWindow) -> dict[str, float]:
    """Cores each role kept busy, their ``total``, and ``other_processes``: the rest of the
    machine's busy time (work that is not part of this benchmark)."""
    cores = window.read().cores()
    out = {k: cores[k] or 0.0 for k in ("instances", "nginx", "workers", CLIENT)}
    out["total"] = round(sum(out.values()), 2)
    out["other_processes"] = cores[OTHER] or 0.0
    out["machine"] = cores[HOST] or 0.0
    return out


# ---- workloads ---------------------------------------------------------------------------------
def char_pool() -> list[str]:
    """Characters of real 上联 (the prepared corpus when there, else shipped text)."""
    from chunlian.text import is_han

    val = ROOT / "runs" / "data" / "val.tsv"
    text = ""
    if val.is_file():
        text = "".join(line.split("\t")[0] for line in val.read_text(encoding="utf-8").splitlines()[1:])
    if len(set(text)) < 200:
        from importlib import resources

        from chunlian.config import DEFAULT_WARMUP

        text += "".join(DEFAULT_WARMUP)
        text += resources.files("chunlian").joinpath("resources", "hengpi.tsv").read_text(encoding="utf-8")
    return sorted({ch for ch in text if is_han(ch)})


def unique_uppers(seed: int) -> Iterator[str]:
    """Endless distinct 7-character upper lines (cache misses)."""
    rng = random.Random(seed)
    pool = char_pool()
    seen: set[str] = set()
    while True:
        line = "".join(rng.choice(pool) for _ in range(7))
        if line not in seen:
            seen.add(line)
            yield line


def miss_requests(seed: int) -> Callable[[], tuple[str, str, bytes]]:
    lines = unique_uppers(seed)

    def make() -> tuple[str, str, bytes]:
        return "POST", "/v1/couplets", json.dumps({"upper": next(lines)}).encode()

    return make


def hit_request() -> tuple[str, str, bytes]:
    return "POST", "/v1/couplets", json.dumps({"upper": HIT_UPPER}).encode()


def health_request() -> tuple[str, str, bytes]:
    return "GET", "/nginx-health", b""


# ---- runs --------------------------------------------------------------------------------------
def _spec(instances: int, threads: int, args: argparse.Namespace, name: str) -> ClusterSpec:
    return ClusterSpec(
        prefix=Path(args.logs) / name if args.logs else None,
        instances=instances, port=free_port(), redis_url=REDIS_URL, torch_threads=threads,
        ready_timeout_s=180, nginx_worker_processes="1",
        env={"CHUNLIAN_WARMUP": "", "CHUNLIAN_DEVICE": args.device,
             "CHUNLIAN_MAX_BATCH_SIZE": str(args.max_batch_size), "CHUNLIAN_LOG_LEVEL": args.log_level},
    )


def run_miss(instances: int, threads: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    with _cluster(_spec(instances, threads, args, f"miss-{instances}x{threads}")) as cluster:
        idle_before = wait_quiet(args.wait_quiet, QUIET_CORES)
        window = cpu_window(cluster)
        stats = load(cluster.url, miss_requests(seed), args.concurrency, args.duration, warm_s=0.0)
        out = summary(stats, args.duration)
        out["config"] = f"{instances} instance(s) x {threads} torch thread(s)"
        out["machine_cores_busy_before"] = idle_before
        out["cpu_cores_used"] = cores_used(window)
        out["machine_busy_share"] = round(out["cpu_cores_used"]["machine"] / (os.cpu_count() or 1), 3)
        if out["rps"]:
            out["instance_cpu_ms_per_request"] = round(1000 * out["cpu_cores_used"]["instances"] / out["rps"], 2)
        return out


def run_overhead(args: argparse.Namespace) -> dict[str, Any]:
    threads = os.cpu_count() or 1
    with _cluster(_spec(1, threads, args, "overhead")) as cluster:
        direct = cluster.describe()["instances"][0]["url"]
        load(direct, hit_request, 1, 0.5, warm_s=0.0)  # prime the cache
        quiet = wait_quiet(args.wait_quiet, QUIET_CORES)
        rounds: dict[str, list[dict[str, Any]]] = {"direct": [], "nginx": []}
        cpu: dict[str, list[dict[str, float]]] = {"direct": [], "nginx": []}
        for _ in range(args.hit_rounds):  # alternated, so that drift and other load hit both alike
            for name, url in (("direct", direct), ("nginx", cluster.url)):
                window = cpu_window(cluster)
                stats = load(url, hit_request, args.concurrency, args.hit_duration, warm_s=0.0)
                cpu[name].append(cores_used(window))
                rounds[name].append(summary(stats, args.hit_duration))
        health = summary(load(cluster.url, health_request, args.concurrency, args.hit_duration / 2),
                         args.hit_duration / 2)

    def agg(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rps": round(statistics.median(r["rps"] for r in rs), 1),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 2),
                "errors": sum(sum(r["errors"].values()) for r in rs),
                "non_200": sum(r["requests"] - r["ok"] for r in rs),
                "cached_share": round(sum(r["cached"].get("true", 0) for r in rs)
                                      / max(1, sum(r["ok"] for r in rs)), 3),
                "rounds_rps": [r["rps"] for r in rs]}

    d, n = agg(rounds["direct"]), agg(rounds["nginx"])
    for key, rs in (("direct", d), ("nginx", n)):
        rs["cpu_cores_used"] = {k: round(statistics.median(c[k] for c in cpu[key]), 2) for k in cpu[key][0]}
        rs["rounds_other_cores"] = [c["other_processes"] for c in cpu[key]]
    # CPU time one instance spends per cache hit (HTTP, validation, cache lookup, JSON)
    d["instance_cpu_ms_per_request"] = round(1000 * d["cpu_cores_used"]["instances"] / d["rps"], 3) if d["rps"] else None
    return {
        "config": f"1 instance x {threads} torch threads, cache hits, concurrency {args.concurrency}",
        "direct": d,
        "through_nginx": n,
        "ratio_nginx_over_direct": round(n["rps"] / d["rps"], 3) if d["rps"] else None,
        "ratio_per_round": [round(b / a, 3) for a, b in zip(d["rounds_rps"], n["rounds_rps"], strict=True) if a],
        "statistic": f"medians of {len(d['rounds_rps'])} alternated rounds of {args.hit_duration:.0f} s",
        "added_p50_ms": round(n["p50_ms"] - d["p50_ms"], 2),
        "nginx_alone_health_rps": health["rps"],
        "nginx_alone_health_p50_ms": health["p50_ms"],
        "machine_cores_busy_before": quiet,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per cache-miss run")
    ap.add_argument("--hit-duration", type=float, default=8.0, help="seconds per cache-hit round")
    ap.add_argument("--hit-rounds", type=int, default=3, help="alternated direct/nginx rounds")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--instances", type=int, default=2, help="the scaled-out configuration")
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--log-level", default="WARNING", help="the instances' CHUNLIAN_LOG_LEVEL")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the instances' device")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cache-miss configuration")
    ap.add_argument("--wait-quiet", type=float, default=300.0,
                    help="before each measurement, wait up to this long for other work on the machine to stop")
    ap.add_argument("--only", default=None, help="run only these miss configs, e.g. 2x1")
    ap.add_argument("--logs", default=None, help="keep each cluster's logs under this directory")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--no-flush", action="store_true", help="do not flush Redis db 10 first")
    args = ap.parse_args()

    import redis

    db = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    for _ in range(60):  # Redis may be restarting (other test suites stop and start it)
        try:
            db.ping()
            break
        except redis.ConnectionError:
            time.sleep(2)
    if not args.no_flush:
        db.flushdb()
    cores = os.cpu_count() or 1
    seed = int(time.time())
    report: dict[str, Any] = {
        "machine": {"cpus": cores, "python": platform.python_version(), "platform": platform.platform()},
        "settings": {"duration_s": args.duration, "hit_duration_s": args.hit_duration,
                     "concurrency": args.concurrency, "max_batch_size": args.max_batch_size,
                     "instance_log_level": args.log_level, "redis": REDIS_URL, "device": args.device},
    }
    configs = [(1, cores), (1, 1), (args.instances, max(1, cores // args.instances))]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.repeat):  # configurations interleaved, so that other load hits all alike
        for i, (n, t) in enumerate(configs):
            key = f"{n}x{t}"
            if args.only and key not in args.only.split(","):
                continue
            res = run_miss(n, t, args, seed + (r * len(configs) + i) * 7919)
            runs.setdefault(key, []).append(res)
            print(f"miss {key}: {res['rps']} req/s, cpu {res['cpu_cores_used']}", file=sys.stderr)
    # per configuration: the run least disturbed by other processes, plus every run's figure
    miss = {}
    for key, rs in runs.items():
        best = min(rs, key=lambda x: x["cpu_cores_used"]["other_processes"])
        best["all_runs_rps"] = [x["rps"] for x in rs]
        best["all_runs_other_cores"] = [x["cpu_cores_used"]["other_processes"] for x in rs]
        miss[key] = best
    report["cache_miss_through_nginx"] = miss
    one, one_1t = miss.get(f"1x{cores}"), miss.get("1x1")
    scaled = miss.get(f"{args.instances}x{max(1, cores // args.instances)}")
    if one and scaled and one["rps"]:
        report["gain_scaled_over_one_instance"] = round(scaled["rps"] / one["rps"], 3)
    if one_1t and scaled and one_1t["rps"]:
        report["gain_scaled_over_one_instance_1_thread"] = round(scaled["rps"] / one_1t["rps"], 3)
    if not args.skip_overhead:
        report["nginx_overhead"] = run_overhead(args)
        print(f"overhead: {report['nginx_overhead']['ratio_nginx_over_direct']}", file=sys.stderr)
    text = json.dumps(report, ensure_ascii=False, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
