"""An async HTTP load generator for ``POST /v1/couplets`` over real upper lines.

Load model: closed loop. ``concurrency`` workers each send a request, wait for the answer
and send the next, for ``duration_s`` seconds or ``max_requests`` requests, whichever
comes first. Requests still in flight when the time is up are cancelled and counted as
``unfinished``; requests/s is the answers received inside the window divided by its length.

What is sent (``RequestPlan``): a share ``unique_ratio`` of the requests are *fresh* (a
request the service has not seen in this run: a real line, in file order, first greedy in
each of the four styles, then, once those run out, the same lines with a seed, which is a
new cacheable request; a plan with another ``seed`` starts far along that sequence), the rest repeat a small *hot set* of lines (greedy, traditional
style), chosen at random. The plan is deterministic for a given seed, so two runs against
two servers send the same requests in the same order.

What is reported: requests/s, latency quantiles (all, cache hits and misses, split by the
response's ``cached`` field), errors by status, and, from ``/metrics`` read before and after
the window, the cache hit ratio, the mean engine batch size and tokens/s. A sampler reads
``/metrics`` once a second during the window for the queue depth (and GPU utilisation on
cuda). With ``server_pid`` (a process on this host) the CPU seconds of the server's process
tree over the window are read too (``bench.cpu``: the server and its engine processes), with
the host's and this process's.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from chunlian.bench.common import percentile, pyplot
from chunlian.bench.cpu import CLIENT, HOST, CpuWindow
from chunlian.bench.plan import (
    DEFAULT_URL,
    ENDPOINT,
    RequestPlan,
    check_url,
    load_lines,
    warmup_body,
)
from chunlian.bench.promtext import Samples, metric, metrics_delta, parse_metrics
from chunlian.bench.rawhttp import RawConnection, encode_body, post_httpx

# ---- the run ----------------------------------------------------------------------------------


@dataclass
class Record:
    """One answered (or failed) request."""

    done_s: float  # since the window opened
    latency_s: float
    status: str  # "200", "429", ..., "timeout", "transport:ConnectError"
    cached: bool | None = None


@dataclass
class LoadResult:
    """Everything one run measured; ``report()`` is the flat summary."""

    url: str
    concurrency: int
    duration_s: float
    max_requests: int
    window_s: float = 0.0
    records: list[Record] = field(default_factory=list)
    unfinished: int = 0
    plan: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] | None = None
    samples: list[dict[str, float]] = field(default_factory=list)
    server_cpu_s: float | None = None
    host_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    warmup_requests: int = 0
    client_kind: str = "httpx"

    def report(self) -> dict[str, Any]:
        ok = [r for r in self.records if r.status == "200"]
        lat = [r.latency_s * 1000 for r in ok]
        hits = [r.latency_s * 1000 for r in ok if r.cached]
        misses = [r.latency_s * 1000 for r in ok if r.cached is False]
        errors: dict[str, int] = {}
        for r in self.records:
            if r.status != "200":
                errors[r.status] = errors.get(r.status, 0) + 1
        w = max(self.window_s, 1e-9)

        def q(xs: list[float], p: float) -> float | None:
            return round(percentile(xs, p), 1) if xs else None

        def mean(xs: list[float]) -> float | None:
            return round(sum(xs) / len(xs), 1) if xs else None

        cores = os.cpu_count() or 1
        out: dict[str, Any] = {
            "url": self.url,
            "concurrency": self.concurrency,
            "duration_s": self.duration_s,
            "window_s": round(self.window_s, 2),
            "requests": len(self.records),
            "ok": len(ok),
            "unfinished": self.unfinished,
            "requests_per_s": round(len(ok) / w, 1),
            "errors": dict(sorted(errors.items())),
            "error_rate": round(sum(errors.values()) / max(len(self.records), 1), 4),
            "p50_ms": q(lat, 50), "p95_ms": q(lat, 95), "p99_ms": q(lat, 99),
            "mean_ms": mean(lat), "max_ms": round(max(lat), 1) if lat else None,
            "hits": len(hits), "misses": len(misses),
            "cached_share": round(len(hits) / len(ok), 4) if ok else None,
            "mean_hit_ms": mean(hits), "mean_miss_ms": mean(misses),
            "p99_hit_ms": q(hits, 99), "p99_miss_ms": q(misses, 99),
            "miss_requests_per_s": round(len(misses) / w, 1),
            "warmup_requests": self.warmup_requests,
            "client": self.client_kind,
            "client_cpu_s": round(self.client_cpu_s, 2),
            "plan": self.plan,
        }
        if self.server is not None:
            out.update(self.server)
        if self.samples:
            depth = [s["queue_depth"] for s in self.samples]
            out["queue_depth_mean"] = round(sum(depth) / len(depth), 1)
            out["queue_depth_max"] = int(max(depth))
            gpu = [s["gpu_util"] for s in self.samples if "gpu_util" in s]
            if gpu:
                out["gpu_utilization_mean"] = round(sum(gpu) / len(gpu), 3)
        if self.server_cpu_s is not None:
            out["server_cpu_s"] = round(self.server_cpu_s, 2)
            out["server_cpu_cores"] = round(self.server_cpu_s / w, 2)
            out["server_cpu_util"] = round(self.server_cpu_s / w / cores, 3)
            out["requests_per_cpu_s"] = round(len(ok) / self.server_cpu_s, 1) if self.server_cpu_s > 0 else None
        if self.host_cpu_s is not None:
            # how busy the host was, and how much of that was neither the server nor this client
            out["host_busy_cores"] = round(self.host_cpu_s / w, 2)
            out["host_other_cores"] = round(max(0.0, (self.host_cpu_s - (self.server_cpu_s or 0.0)
                                                      - self.client_cpu_s) / w), 2)
        out["host_cpus"] = cores
        return out


class _Progress:
    """A tqdm bar over the window's seconds, with the answers so far (stderr)."""

    def __init__(self, enabled: bool, duration_s: float, label: str) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=round(duration_s, 1), desc=label, unit="s", leave=False,
                            file=sys.stderr, bar_format="{desc} {bar} {n:.0f}/{total:.0f}s{postfix}")

    def update(self, elapsed: float, ok: int, err: int) -> None:
        if self.bar is None:
            return
        self.bar.n = min(round(elapsed, 1), self.bar.total)
        rate = ok / elapsed if elapsed > 0 else 0.0
        self.bar.set_postfix_str(f"ok={ok} err={err} {rate:.0f} req/s", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def _scrape(client: httpx.AsyncClient) -> Samples | None:
    try:
        r = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return parse_metrics(r.text)
    except ValueError:
        return None  # not a Prometheus exposition: a server that is not chunlian


Poster = Callable[[bytes], Awaitable[tuple[str, "bool | None"]]]


async def _warmup(posters: list[Poster], lines: list[str], seconds: float) -> int:
    """Send seeded warm-up requests for ``seconds``; wait for the last ones (not measured)."""
    deadline = time.monotonic() + seconds
    counter = iter(range(1 << 62))
    sent = 0

    async def worker(post: Poster) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            sent += 1
            await post(encode_body(warmup_body(lines, next(counter))))

    await asyncio.gather(*(worker(p) for p in posters))
    return sent


async def run_load_async(
    url: str = DEFAULT_URL,
    concurrency: int = 32,
    duration_s: float = 10.0,
    max_requests: int = 100_000,
    plan: RequestPlan | None = None,
    *,
    warmup_s: float = 0.0,
    timeout_s: float = 30.0,
    sample_interval_s: float = 1.0,
    server_pid: int | None = None,
    progress: bool = False,
    label: str = "load",
    client_kind: str = "auto",
    transport: httpx.AsyncBaseTransport | None = None,
) -> LoadResult:
    """Run one bounded load against ``url`` and return what was measured.

    ``client_kind``: ``raw`` (``RawConnection``, one per worker; plain http only), ``httpx``,
    or ``auto`` (raw for http:// without a ``transport``, else httpx). ``/metrics`` is always
    read with httpx.
    """
    url = check_url(url)
    if concurrency < 1 or duration_s <= 0 or max_requests < 1:
        raise ValueError("concurrency and max_requests must be >= 1 and duration_s > 0")
    parts = urlsplit(url)
    if client_kind == "auto":
        client_kind = "raw" if parts.scheme == "http" and transport is None else "httpx"
    if client_kind not in ("raw", "httpx") or (client_kind == "raw" and parts.scheme != "http"):
        raise ValueError(f"client {client_kind!r} cannot drive {url}")
    plan = plan if plan is not None else RequestPlan(load_lines())
    res = LoadResult(url, concurrency, duration_s, max_requests)
    res.client_kind = client_kind
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits, transport=transport) as client:
        conns: list[RawConnection] = []
        if client_kind == "raw":
            port = parts.port or 80
            conns = [RawConnection(parts.hostname or "127.0.0.1", port, timeout_s) for _ in range(concurrency)]
            prefix = parts.path.rstrip("/")
            posters: list[Poster] = [functools.partial(c.post, prefix + ENDPOINT) for c in conns]
        else:
            posters = [functools.partial(post_httpx, client)] * concurrency
        try:
            return await _measure(res, client, posters, plan, warmup_s, sample_interval_s,
                                  server_pid, progress, label)
        finally:
            for c in conns:
                c.close()


async def _measure(
    res: LoadResult, client: httpx.AsyncClient, posters: list[Poster], plan: RequestPlan,
    warmup_s: float, sample_interval_s: float, server_pid: int | None, progress: bool, label: str,
) -> LoadResult:
    duration_s, max_requests = res.duration_s, res.max_requests
    if warmup_s > 0:
        res.warmup_requests = await _warmup(posters, plan.lines, warmup_s)
    before = await _scrape(client)
    meter = CpuWindow({"server": [server_pid]} if server_pid else {})
    bar = _Progress(progress, duration_s, label)
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    issued = 0
    ok = err = 0
    records = res.records

    async def worker(post: Poster) -> None:
        nonlocal issued, ok, err
        while issued < max_requests and time.perf_counter() < deadline:
            issued += 1
            body = encode_body(plan.next_body())
            start = time.perf_counter()
            status, cached = await post(body)
            end = time.perf_counter()
            records.append(Record(end - t0, end - start, status, cached))
            if status == "200":
                ok += 1
            else:
                err += 1

    async def sampler() -> None:
        while True:
            await asyncio.sleep(sample_interval_s)
            s = await _scrape(client)
            if s is not None:
                snap = {"t": time.perf_counter() - t0,
                        "queue_depth": metric(s, "chunlian_queue_depth"),
                        "running": metric(s, "chunlian_engine_running")}
                if "chunlian_gpu_utilization_ratio" in s:
                    snap["gpu_util"] = metric(s, "chunlian_gpu_utilization_ratio")
                res.samples.append(snap)

    async def ticker() -> None:
        while True:
            bar.update(time.perf_counter() - t0, ok, err)
            await asyncio.sleep(0.25)

    workers = [asyncio.ensure_future(worker(p)) for p in posters]
    helpers = [asyncio.ensure_future(ticker())]
    if before is not None and sample_interval_s > 0:
        helpers.append(asyncio.ensure_future(sampler()))
    try:
        _, pending = await asyncio.wait(workers, timeout=max(0.0, deadline - time.perf_counter()))
        res.window_s = min(time.perf_counter(), deadline) - t0 if pending else (
            max((r.done_s for r in records), default=0.0))
        res.unfinished = len(pending)
        for task in pending:
            task.cancel()
        for task in helpers:
            task.cancel()
        await asyncio.gather(*pending, *helpers, return_exceptions=True)
    finally:
        bar.close()
    # answers that arrived after the window closed (cancellation raced them) are not counted
    kept = [r for r in records if r.done_s <= res.window_s + 1e-6]
    res.unfinished += len(records) - len(kept)
    res.records = kept
    cpu = meter.read().seconds
    res.client_cpu_s = cpu[CLIENT] or 0.0
    res.host_cpu_s = cpu[HOST]
    res.server_cpu_s = cpu.get("server")
    after = await _scrape(client)
    if before is not None and after is not None:
        res.server = metrics_delta(before, after, res.window_s)
    res.plan = plan.stats()
    return res


def run_load(*args: Any, **kwargs: Any) -> LoadResult:
    """``run_load_async`` in a fresh event loop."""
    return asyncio.run(run_load_async(*args, **kwargs))


# ---- presentation -----------------------------------------------------------------------------


def format_report(rep: dict[str, Any]) -> str:
    """A short human-readable summary of ``LoadResult.report()``."""
    rows = [
        ("url", rep["url"]),
        ("concurrency", rep["concurrency"]),
        ("window", f'{rep["window_s"]} s ({rep["requests"]} answered, {rep["unfinished"]} unfinished)'),
        ("requests/s", rep["requests_per_s"]),
        ("latency p50/p95/p99", f'{rep["p50_ms"]} / {rep["p95_ms"]} / {rep["p99_ms"]} ms'),
        ("mean latency hit/miss", f'{rep["mean_hit_ms"]} / {rep["mean_miss_ms"]} ms'),
        ("errors by status", rep["errors"] or "none"),
        ("cached answers (client)", rep["cached_share"]),
        ("cache hit ratio (/metrics)", rep.get("cache_hit_ratio")),
        ("mean batch size (/metrics)", rep.get("mean_batch_size")),
        ("tokens/s (/metrics)", rep.get("tokens_per_s")),
        ("queue depth mean/max", f'{rep.get("queue_depth_mean")} / {rep.get("queue_depth_max")}'),
    ]
    if "server_cpu_cores" in rep:
        rows.append(("server CPU", f'{rep["server_cpu_cores"]} cores ({rep["server_cpu_util"]:.0%} of {rep["host_cpus"]})'))
    if "host_busy_cores" in rep:
        rows.append(("host CPU busy (others)", f'{rep["host_busy_cores"]} cores ({rep["host_other_cores"]} by other processes)'))
    if "gpu_utilization_mean" in rep:
        rows.append(("GPU utilisation", rep["gpu_utilization_mean"]))
    return "\n".join(f"{k:28s} {v}" for k, v in rows)


def plot_timeline(res: LoadResult, path: Path, title: str | None = None) -> Path:
    """Requests/s and latency (p50/p99 of each second; hits and misses) over the window."""
    plt = pyplot()
    secs = max(1, int(res.window_s + 0.999))
    ok = [r for r in res.records if r.status == "200"]
    per_s: list[list[float]] = [[] for _ in range(secs)]
    for r in ok:
        per_s[min(secs - 1, int(r.done_s))].append(r.latency_s * 1000)
    xs = [i + 0.5 for i in range(secs)]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a1.bar(xs, [len(b) for b in per_s], width=0.9, color="#c0392b")
    a1.set_ylabel("answers / s")
    a1.set_title(title or f"{res.url}  concurrency {res.concurrency}")
    for cached, color, name in ((True, "#27ae60", "hit"), (False, "#2c3e50", "miss")):
        pts = [(r.done_s, r.latency_s * 1000) for r in ok if r.cached is cached]
        if pts:
            a2.scatter(*zip(*pts, strict=True), s=3, alpha=0.25, color=color, label=f"{name}")
    a2.plot(xs, [percentile(b, 50) if b else float("nan") for b in per_s], color="#e67e22", label="p50")
    a2.plot(xs, [percentile(b, 99) if b else float("nan") for b in per_s], color="#8e44ad", label="p99")
    a2.set_yscale("log")
    a2.set_ylabel("latency (ms)")
    a2.set_xlabel("seconds into the window")
    a2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
