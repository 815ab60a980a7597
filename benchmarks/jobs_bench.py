"""Bulk jobs, measured side by side in one run; prints one JSON object.

1. ``engine_peak``: ``chunlian bench engine --json`` (continuous batching, every request
   submitted at once, offline): the most sequences per second this model does here.
2. ``celery``: ~1000 distinct items as one job through Celery + Redis to one real
   ``chunlian worker`` (concurrency 1, the model loaded once in its process, same torch
   threads and batch size), timed from submission to the last result. Ratio to (1).
3. ``interactive``: p50/p99 latency of ``POST /v1/couplets`` (unique lines: cache misses)
   at concurrency 16 against one ``chunlian serve`` process, first alone, then while an
   in-process bulk job (thousands of items, ``bulk`` priority, the same engine) runs on
   it. Ratio of the p99s; and how many bulk items got done meanwhile. ``--quality-job``:
   again with the bulk job in the best mode (through the engine's search rows, at bulk priority).
4. ``colocated`` (``--colocated``): the same interactive load while a Celery worker on the
   same machine runs a job, (a) with its own model (competing for the cores; at the default
   ``worker_nice`` and, for comparison, not niced), (b) with ``--engine-url`` (items sent to
   the instance's engine at bulk priority).

    python benchmarks/jobs_bench.py [--threads 2] [--items 1000] [--duration 20] [--colocated]

Needs Redis on 127.0.0.1:6379 (db 12; only this run's keys are deleted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from chunlian.bench.common import percentile
from chunlian.bench.cpu import CLIENT, HOST, OTHER, CpuWindow
from chunlian.bench.cpu import wait_quiet as wait_quiet_cores
from chunlian.bench.spawn import Spawned, serving, spawn
from chunlian.cluster.procs import free_port
from chunlian.data.samples import sample_uppers
from chunlian.errors import InvalidInput
from chunlian.text import validate_upper

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/12"
QUIET_S = 300.0  # --wait-quiet


def distinct_uppers(n: int, salt: int) -> list[str]:
    """``n`` distinct valid upper lines: real lines (salt 0), then real lines with a clause
    of another appended; different salts give (mostly) different lines."""
    pool = []
    for u in sample_uppers():
        with contextlib.suppress(InvalidInput):
            pool.append(validate_upper(u))
    size = len(pool)
    out: list[str] = pool[:n] if salt == 0 else []
    seen = set(out)
    for k in itertools.count():
        if len(out) >= n:
            break
        for j in range(size):
            b = pool[(j * 7 + k * 31 + salt * 101 + 1) % size]
            try:
                cand = validate_upper(f"{pool[j]}，{b[: 3 + (k + salt) % 5]}")
            except InvalidInput:
                continue
            if cand not in seen:
                seen.add(cand)
                out.append(cand)
                if len(out) >= n:
                    break
    return out[:n]


def base_env(threads: int, batch: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNLIAN_")}
    env.update({"CHUNLIAN_TORCH_THREADS": str(threads), "CHUNLIAN_DEVICE": "cpu",
                "CHUNLIAN_MAX_BATCH_SIZE": str(batch), "CHUNLIAN_LOG_LEVEL": "WARNING",
                "CHUNLIAN_WARMUP": "", "PYTHONPATH": str(ROOT)})
    return env


QUIET: dict[str, float] = {}


def cpu_report(window: CpuWindow) -> dict[str, float]:
    """Cores used during a phase: by the whole machine, by this run's own processes (this
    one and the process trees of the servers and workers it started: ``bench.cpu``), and the
    rest, other work."""
    c = window.read().cores()
    own = (c["own"] or 0.0) + (c[CLIENT] or 0.0)
    return {"machine_cores": c[HOST] or 0.0, "own_cores": round(own, 2), "other_cores": c[OTHER] or 0.0}


def wait_quiet(phase: str, limit_s: float, max_cores: float = 0.3) -> None:
    """Wait (up to ``limit_s``) until the machine uses under ``max_cores`` cores (other work,
    e.g. another benchmark, would skew the figures); records the busy cores per phase."""
    QUIET[phase] = wait_quiet_cores(limit_s, max_cores)


def wait_for(pred: Any, limit_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every_s)


# ---- 1. the engine's offline peak -------------------------------------------------------------
def engine_peak(threads: int, batch: int, requests: int, quiet_s: float = 0) -> dict[str, Any]:
    wait_quiet("engine_peak", quiet_s)
    cmd = [sys.executable, "-m", "chunlian.cli", "bench", "engine", "--json", "--torch-threads", str(threads),
           "--max-batch-size", str(batch), "--requests", str(requests), "--sequential-requests", "20"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=1800)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return {"command": " ".join(cmd[2:]), **{k: report[k] for k in (
        "model", "requests", "max_batch_size", "torch_threads", "continuous_seq_per_s", "static_seq_per_s",
        "sequential_seq_per_s")}}


# ---- 2. Celery ------------------------------------------------------------------------------------
def start_worker(env: dict[str, str], logs: Path, extra: list[str] | None = None) -> Spawned:
    """``chunlian worker`` in its own session (``stop`` takes its pool too), once it says ready."""
    log = logs / f"worker-{uuid.uuid4().hex[:6]}.log"
    w = spawn([sys.executable, "-m", "chunlian.cli", "worker", "--concurrency", "1", "--log-level", "INFO",
               *(extra or [])], env=env, log_path=log, own_session=True, cwd=ROOT)
    wait_for(lambda: " ready." in log.read_text(errors="replace") or w.proc.poll() is not None, 300, "worker")
    if w.proc.poll() is not None:
        raise RuntimeError(f"worker exited: {w.log_tail()}")
    return w


def celery_settings(queue: str, chunk: int, threads: int, batch: int) -> Any:
    from chunlian.config import load_settings

    return load_settings(broker_url=REDIS_URL, job_queue=queue, job_chunk_size=chunk,
                         torch_threads=threads, max_batch_size=batch, job_result_ttl_s=3600)


def drop_queue(jobs: Any, queue: str) -> None:
    keys = list(jobs.store.r.scan_iter(f"*{queue}*", count=1000))
    if keys:
        jobs.store.r.delete(*keys)


class JobLost(RuntimeError):
    """The job's keys vanished (Redis restarted or was flushed by other work)."""


def run_job(jobs: Any, specs: list[dict[str, Any]], limit_s: float) -> tuple[str, float]:
    t0 = time.perf_counter()
    job_id = asyncio.run(jobs.submit(specs))

    def finished() -> bool:
        st = jobs.store.state(job_id)
        if st is None:
            raise JobLost(f"job {job_id} vanished from Redis")
        return bool(st.finished)

    wait_for(finished, limit_s, "the job", every_s=0.1)
    return job_id, time.perf_counter() - t0


def celery_throughput(threads: int, batch: int, items: int, chunk: int, logs: Path) -> dict[str, Any]:
    from chunlian.jobs.backend import CeleryJobs

    queue = f"jobs-bench-{uuid.uuid4().hex[:8]}"
    settings = celery_settings(queue, chunk, threads, batch)
    jobs = CeleryJobs(settings)
    env = base_env(threads, batch) | {"CHUNLIAN_BROKER_URL": REDIS_URL, "CHUNLIAN_JOB_QUEUE": queue,
                                      "CHUNLIAN_JOB_RESULT_TTL_S": "3600"}
    ids: list[str] = []
    worker = start_worker(env, logs)
    try:
        warm, _ = run_job(jobs, [{"upper": u, "style": "traditional"} for u in distinct_uppers(64, 7)], 600)
        ids.append(warm)
        specs = [{"upper": u, "style": "traditional"} for u in distinct_uppers(items, 0)]
        for attempt in range(3):
            wait_quiet("celery", QUIET_S)
            meter = CpuWindow({"own": [worker.pid]})
            try:
                job_id, wall = run_job(jobs, specs, 3600)
            except JobLost as e:
                print(f"jobs_bench: {e}; measuring again", file=sys.stderr)
                continue
            ids.append(job_id)
            st = jobs.store.state(job_id)
            assert st is not None
            return {"items": items, "chunk_size": chunk, "worker_concurrency": 1, "torch_threads": threads,
                    "max_batch_size": batch, "wall_s": round(wall, 2),
                    "items_per_s": round(items / wall, 1), "done": st.done, "failed": st.failed,
                    "cpu": cpu_report(meter), "attempts": attempt + 1}
        raise RuntimeError("the Celery job vanished three times")
    finally:
        worker.stop()
        for j in ids:
            jobs.store.delete(j)
        drop_queue(jobs, queue)
        jobs.store.close()


# ---- 3. interactive latency with and without bulk ---------------------------------------------------
async def interactive_load(url: str, uppers: list[str], concurrency: int, duration_s: float) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0
    it = iter(uppers)
    stop_at = time.perf_counter() + duration_s

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            u = next(it, None)
            if u is None:
                return
            t = time.perf_counter()
            # fast: the same interactive work in every phase (auto would step down beside a job)
            r = await c.post("/v1/couplets", json={"upper": u, "quality": "fast"})
            if r.status_code == 200 and not r.json()["cached"]:
                lat.append(time.perf_counter() - t)
            else:
                errors += 1

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": errors, "req_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(percentile(lat, 50) * 1000, 1), "p99_ms": round(percentile(lat, 99) * 1000, 1)}


@contextlib.contextmanager
def running_server(env: dict[str, str], logs: Path) -> Iterator[Spawned]:
    """``chunlian serve`` on a free loopback port in its own session, once ready."""
    port = free_port()
    with serving([sys.executable, "-m", "chunlian.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                 port, what="the server", limit_s=300, env=env, log_path=logs / f"serve-{port}.log",
                 own_session=True, cwd=ROOT) as server:
        yield server


def progress(url: str, job_id: str) -> dict[str, int]:
    return httpx.get(f"{url}/v1/jobs/{job_id}", params={"limit": 0}, timeout=10).json()["progress"]  # type: ignore[no-any-return]


def interactive(threads: int, batch: int, concurrency: int, duration: float, bulk_items: int,
                logs: Path, share: float | None = None, quality: bool = False) -> dict[str, Any]:
    env = base_env(threads, batch)
    if share is not None:
        env["CHUNLIAN_BULK_MIN_SHARE"] = str(share)
    with running_server(env, logs) as server:
        url = server.url
        pool = distinct_uppers(20000, 1)
        n = len(pool) // 3
        warm, alone_u, with_u = pool[:400], pool[400:n], pool[n:2 * n]
        bulk_u = distinct_uppers(bulk_items, 3)
        asyncio.run(interactive_load(url, warm, concurrency, 5))
        wait_quiet("interactive_alone", QUIET_S)
        meter = CpuWindow({"own": [server.pid]})
        alone = asyncio.run(interactive_load(url, alone_u, concurrency, duration))
        alone["cpu"] = cpu_report(meter)
        r = httpx.post(f"{url}/v1/jobs", json={"items": [{"upper": u} for u in bulk_u], "quality": quality},
                       timeout=60)
        r.raise_for_status()
        job_id = r.json()["job_id"]
        wait_for(lambda: progress(url, job_id)["done"] > 0, 300, "the bulk job to start")
        # (no quiet wait here: the bulk job is running on purpose)
        p0, t0 = progress(url, job_id), time.perf_counter()
        meter = CpuWindow({"own": [server.pid]})
        with_bulk = asyncio.run(interactive_load(url, with_u, concurrency, duration))
        with_bulk["cpu"] = cpu_report(meter)
        p1, t1 = progress(url, job_id), time.perf_counter()
        bulk_during = p1["done"] - p0["done"]
        still_running = p1["done"] + p1["failed"] < p1["total"]
        time.sleep(3)
        p2, t2 = progress(url, job_id), time.perf_counter()
        httpx.delete(f"{url}/v1/jobs/{job_id}", timeout=30)
        return {
            "concurrency": concurrency, "duration_s": duration, "torch_threads": threads, "max_batch_size": batch,
            "bulk_min_share": share if share is not None else "default (0.125)", "quality_job": quality,
            "alone": alone, "with_bulk_job": with_bulk,
            "p99_ratio_with_vs_alone": round(with_bulk["p99_ms"] / alone["p99_ms"], 2),
            "p50_ratio_with_vs_alone": round(with_bulk["p50_ms"] / alone["p50_ms"], 2),
            "bulk_items_per_s_during_load": round(bulk_during / (t1 - t0), 1),
            "bulk_items_per_s_alone": round((p2["done"] - p1["done"]) / (t2 - t1), 1),
            "bulk_job_still_running_at_end": still_running, "bulk_failed": p1["failed"],
        }


# ---- 4. a Celery worker on the serving machine ------------------------------------------------------
def items_done(jobs: Any, job_id: str) -> int:
    st = jobs.store.state(job_id)
    if st is None:
        raise JobLost(f"job {job_id} vanished from Redis")
    return int(st.done)


def colocated(threads: int, batch: int, concurrency: int, duration: float, items: int, logs: Path) -> dict[str, Any]:
    from chunlian.jobs.backend import CeleryJobs

    out: dict[str, Any] = {}
    with running_server(base_env(threads, batch), logs) as server:
        url = server.url
        pool = distinct_uppers(26000, 2)
        asyncio.run(interactive_load(url, pool[:300], concurrency, 5))
        wait_quiet("colocated_alone", QUIET_S)
        meter = CpuWindow({"own": [server.pid]})
        out["alone"] = asyncio.run(interactive_load(url, pool[300:6000], concurrency, duration))
        out["alone"]["cpu"] = cpu_report(meter)
        variants: tuple[tuple[str, list[str], int, dict[str, str]], ...] = (("worker_own_model", [], 1, {}),
                    ("worker_own_model_not_niced", [], 3, {"CHUNLIAN_WORKER_NICE": "0"}),
                    ("worker_via_engine_url", ["--engine-url", url], 2, {}))
        for name, extra, k, env_extra in variants:
            queue = f"jobs-bench-{uuid.uuid4().hex[:8]}"
            jobs = CeleryJobs(celery_settings(queue, 50, threads, batch))
            env = base_env(threads, batch) | {"CHUNLIAN_BROKER_URL": REDIS_URL, "CHUNLIAN_JOB_QUEUE": queue,
                                              "CHUNLIAN_JOB_RESULT_TTL_S": "3600"} | env_extra
            wait_quiet(f"colocated_{name}", QUIET_S)
            worker = start_worker(env, logs, extra)
            job_id = ""
            try:
                job_id = asyncio.run(jobs.submit([{"upper": u, "style": "traditional"}
                                                  for u in distinct_uppers(items, 10 + k)]))
                wait_for(lambda: items_done(jobs, job_id) > 0, 300, "the worker to start")  # noqa: B023
                d0, t0 = items_done(jobs, job_id), time.perf_counter()
                meter = CpuWindow({"own": [server.pid, worker.pid]})
                load = asyncio.run(interactive_load(url, pool[6000 * k:6000 * (k + 1)], concurrency, duration))
                load["cpu"] = cpu_report(meter)
                d1, t1 = items_done(jobs, job_id), time.perf_counter()
                load["bulk_items_per_s_during_load"] = round((d1 - d0) / (t1 - t0), 1)
                load["p99_ratio_vs_alone"] = round(load["p99_ms"] / out["alone"]["p99_ms"], 2)
                out[name] = load
            finally:
                if job_id:
                    jobs.store.cancel(job_id)
                worker.stop()
                if job_id:
                    jobs.store.delete(job_id)
                drop_queue(jobs, queue)
                jobs.store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--items", type=int, default=1000, help="items of the Celery job")
    ap.add_argument("--chunk-size", type=int, default=50)
    ap.add_argument("--engine-requests", type=int, default=800)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per interactive phase")
    ap.add_argument("--bulk-items", type=int, default=5000, help="items of the in-process bulk job")
    ap.add_argument("--shares", default="", help="also measure (3) with these CHUNLIAN_BULK_MIN_SHARE values")
    ap.add_argument("--colocated", action="store_true", help="also: a Celery worker beside the server")
    ap.add_argument("--quality-job", action="store_true",
                    help="also measure (3) with the bulk job in the best mode")
    ap.add_argument("--skip", default="", help="comma-separated: engine,celery,interactive")
    ap.add_argument("--wait-quiet", type=float, default=300.0,
                    help="before each measurement, wait up to this long for other work on the machine to stop")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    # a SIGTERM must still stop the servers and workers this run started (finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    global QUIET_S
    QUIET_S = args.wait_quiet
    skip = set(args.skip.split(","))
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"jobs-bench-{uuid.uuid4().hex[:6]}"
    logs.mkdir(parents=True)
    report: dict[str, Any] = {"host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                                       "python": platform.python_version()}, "logs": str(logs)}
    if "engine" not in skip:
        report["engine_peak"] = engine_peak(args.threads, args.max_batch_size, args.engine_requests, QUIET_S)
    if "celery" not in skip:
        report["celery"] = celery_throughput(args.threads, args.max_batch_size, args.items, args.chunk_size, logs)
        if "engine_peak" in report:
            report["celery_vs_engine_peak"] = round(
                report["celery"]["items_per_s"] / report["engine_peak"]["continuous_seq_per_s"], 2)
    if "interactive" not in skip:
        report["interactive"] = interactive(args.threads, args.max_batch_size, args.concurrency, args.duration,
                                            args.bulk_items, logs)
        for share in [float(x) for x in args.shares.split(",") if x]:
            report[f"interactive_share_{share:g}"] = interactive(
                args.threads, args.max_batch_size, args.concurrency, args.duration, args.bulk_items, logs, share)
        if args.quality_job:
            report["interactive_quality_job"] = interactive(
                args.threads, args.max_batch_size, args.concurrency, args.duration, args.bulk_items, logs,
                quality=True)
    if args.colocated:
        report["colocated"] = colocated(args.threads, args.max_batch_size, args.concurrency, args.duration,
                                        args.bulk_items, logs)
    report["machine_cores_busy_before"] = QUIET
    text = json.dumps(report, ensure_ascii=False, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
