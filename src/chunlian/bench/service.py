"""``chunlian bench service``: what the HTTP layer and the cache cost, side by side in one run.

Three measurements, each against its own reference, taken one after another in one process
tree on the same machine (loopback, bounded in time):

1. **Cache hits against a bare endpoint.** A bare FastAPI app (``bare_app``: one POST route
   returning a constant couplet, served by the same uvicorn configuration as chunlian) and
   chunlian with its in-process cache warmed, every request a hit. Ratio of requests/s and
   of p50 (bare p50 / chunlian p50; both "higher is better").
2. **Cache misses at concurrency 64 against the offline engine's peak.** chunlian answering
   distinct lines (every request a miss, so every request goes through the engine), and
   ``chunlian bench engine``'s continuous mode on the same model, same ``max_batch_size``,
   on the same kind of requests the HTTP phase sends (same lines and styles, and the same
   share of seeded, sampled ones, which cost more a step than greedy ones), all submitted at
   once (no HTTP). Every miss is a seeded request (the plan's seeded part,
   ``RequestPlan(seed=1)``), so the share is 1.0 from the first request to the last and the
   peak runs exactly it. (The plan's greedy requests come first and run out within a phase:
   with its running share, the share would grow from round to round, and peaks run before a
   round's misses would get a smaller one than the misses.) The
   peak is the engine's steady rate, between 10% and 90% of the requests done
   (``engine.steady_rate``): the served closed loop never fills from empty nor drains (the
   whole-run rate, also reported, is lower). The peak is the better
   of 1 and 2 torch threads (each the mean of its rounds); both are reported.

The phases run in ``rounds`` (default 2), each round every phase for ``duration / rounds``
seconds, the order reversed every other round; the figures are the rounds' means, and each
round's are kept. One pass of each phase after the other would carry the host's drift into
the ratios: on a shared 2-core VM the engine's own speed can move by half between two phases
a minute apart (``docs/performance.md``, "Measurements behind the code").

The ratios are only as good as the machine's quiet: run it with nothing else going on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from chunlian.bench.loadgen import run_load
from chunlian.bench.plan import RequestPlan, load_lines
from chunlian.bench.spawn import serving
from chunlian.bench.sweep import run_server
from chunlian.cluster.procs import free_port
from chunlian.config import load_settings


@contextmanager
def bare_server(ready_limit_s: float = 60.0) -> Iterator[tuple[str, int]]:
    """Start ``chunlian.bench.bare_app`` on a loopback port; yield (url, pid); stop it."""
    port = free_port()
    with serving([sys.executable, "-m", "chunlian.bench.bare_app", str(port)], port,
                 what="the bare app", ready_path="/healthz", limit_s=ready_limit_s, grace_s=10) as app:
        yield app.url, app.pid


def _warm_hits(url: str, lines: list[str]) -> None:
    """Answer every hot line once, so that the measured requests are all cache hits."""
    with httpx.Client(base_url=url, timeout=120.0) as c:
        for u in lines:
            r = c.post("/v1/couplets", json={"upper": u})
            r.raise_for_status()


def engine_peak(max_batch_size: int, requests: int, threads: int,
                model_path: Path | None = None, workload: str = "http",
                seeded_share: float = 0.0) -> dict[str, Any]:
    """Continuous batching offline (``bench.engine``), all requests at once, in a child
    process (its torch threads must not share this process with the load generator);
    ``seeded_share`` of them sampled, as the served misses were (``engine.http_requests``)."""
    code = (
        "import json,sys,asyncio,torch\n"
        "from pathlib import Path\n"
        "from chunlian.bench.engine import peak\n"
        f"print(json.dumps(peak({str(model_path) if model_path else None!r}, {max_batch_size}, "
        f"{requests}, {threads}, {workload!r}, seeded_share={seeded_share!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def replicas_peak(max_batch_size: int, requests: int, replicas: int, threads: int,
                  seeded_share: float = 0.0) -> dict[str, Any]:
    """The offline peak of the served replica layout (``engine.replicas``): ``replicas``
    engine processes side by side, each with its share of the rows (``engine.replicated_peak``,
    imported here: ``bench.engine`` loads torch, which the load generator's process does without)."""
    from chunlian.bench.engine import replicated_peak

    return replicated_peak(None, max_batch_size, requests, replicas, threads, "http",
                           seeded_share=seeded_share)


def _phase(url: str, pid: int | None, concurrency: int, duration_s: float, plan: RequestPlan,
           label: str, progress: bool, warmup_s: float = 1.0) -> dict[str, Any]:
    res = run_load(url, concurrency, duration_s, 1_000_000, plan, warmup_s=warmup_s,
                   server_pid=pid, progress=progress, label=label)
    rep = res.report()
    return {k: rep.get(k) for k in ("requests", "requests_per_s", "p50_ms", "p95_ms", "p99_ms",
                                    "errors", "cached_share", "mean_batch_size",
                                    "server_cpu_cores", "host_busy_cores", "host_other_cores")}


MISS_SEEDED_SHARE = 1.0  # a plan with seed >= 1 sends seeded requests only (``RequestPlan.unique_body``)


def _seeded(plan: RequestPlan) -> float:
    """The share of ``plan``'s fresh requests sent so far that were seeded (sampled)."""
    return round(plan.sent_seeded / plan.sent_unique, 3) if plan.sent_unique else 0.0


def _mean_phase(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one phase: numeric fields averaged, error counts summed, rounds kept."""
    out: dict[str, Any] = {}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        if k == "errors":
            merged: dict[str, int] = {}
            for e in vals:
                for code, n in (e or {}).items():
                    merged[code] = merged.get(code, 0) + n
            out[k] = merged
        elif k == "requests":
            out[k] = sum(vals)
        elif all(isinstance(v, (int, float)) for v in vals):
            out[k] = round(sum(vals) / len(vals), 3)
        else:
            out[k] = vals[-1]
    out["requests_per_s_by_round"] = [r["requests_per_s"] for r in runs]
    return out


def run_service_bench(
    *, duration_s: float = 15.0, hit_concurrency: int = 64, miss_concurrency: int = 64,
    max_batch_size: int = 64, engine_requests: int = 1200, hot_size: int = 16,
    progress: bool = True, data: Path | None = None,
    rounds: int = 2, engine_replicas: int = 0,
) -> dict[str, Any]:
    """Run the phases of the module docstring in ``rounds``; return one JSON-able report."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    lines = load_lines(data)
    hot = lines[-hot_size:]
    served = load_settings(max_batch_size=max_batch_size, engine_replicas=engine_replicas)
    replicas = served.resolved_engine_replicas()
    slice_s = duration_s / rounds
    out: dict[str, Any] = {"meta": {"duration_s": duration_s, "rounds": rounds,
                                    "hit_concurrency": hit_concurrency,
                                    "miss_concurrency": miss_concurrency,
                                    "max_batch_size": max_batch_size, "cpus": os.cpu_count(),
                                    "engine_replicas": replicas}}
    settings = {"max_batch_size": max_batch_size, "engine_replicas": replicas}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("bare", "hits", "misses", "t1", "t2", "replicas")}
    # both servers stay up (idle between their phases); the engine peaks run in child processes
    with bare_server() as (bare_url, bare_pid), run_server(settings) as srv:
        _warm_hits(srv.url, hot)
        # seeded requests only (module docstring): the same mix in every round and in the peaks;
        # the report's misses_seeded_share counts what was sent
        miss_plan = RequestPlan(lines, unique_ratio=1.0, seed=1)
        phases = {
            "bare": lambda: _phase(bare_url, bare_pid, hit_concurrency, slice_s,
                                   RequestPlan(lines, unique_ratio=0.0, hot_size=hot_size), "bare", progress),
            "hits": lambda: _phase(srv.url, srv.pid, hit_concurrency, slice_s,
                                   RequestPlan(lines, unique_ratio=0.0, hot_size=hot_size), "hits", progress),
            # one plan through the rounds: each round goes on where the last stopped (a line
            # answered once would be a hit the next time)
            "misses": lambda: _phase(srv.url, srv.pid, miss_concurrency, slice_s, miss_plan,
                                     "misses", progress, warmup_s=3.0 if not runs["misses"] else 1.0),
            # the misses' mix, every request seeded, whether or not a round's misses ran yet
            "t1": lambda: engine_peak(max_batch_size, engine_requests, 1, seeded_share=MISS_SEEDED_SHARE),
            "t2": lambda: engine_peak(max_batch_size, engine_requests, 2, seeded_share=MISS_SEEDED_SHARE),
        }
        if replicas > 1:  # the served layout offline too: the peak is the best of them all
            phases["replicas"] = lambda: replicas_peak(
                max_batch_size, engine_requests, replicas, served.resolved_replica_threads(replicas),
                seeded_share=MISS_SEEDED_SHARE)
        order = list(phases)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                runs[name].append(phases[name]())
    out["bare"], out["hits"], out["misses"] = (_mean_phase(runs[k]) for k in ("bare", "hits", "misses"))
    out["engine"] = {}
    for key, name in (("t1", "threads_1"), ("t2", "threads_2"), ("replicas", f"replicas_{replicas}")):
        per_round = runs[key]
        if not per_round:
            continue
        out["engine"][name] = {
            **per_round[-1], "seq_per_s": round(sum(x["seq_per_s"] for x in per_round) / rounds, 1),
            "steady_seq_per_s": round(sum(x["steady_seq_per_s"] for x in per_round) / rounds, 1),
            "seq_per_s_by_round": [x["seq_per_s"] for x in per_round],
            "steady_seq_per_s_by_round": [x["steady_seq_per_s"] for x in per_round],
        }
    # the steady rate: a served closed loop runs at its steady state, never filling from
    # empty nor draining to it (the whole-run rate, which includes both, is lower)
    peak = max(v["steady_seq_per_s"] for v in out["engine"].values())
    bare, hits, misses = out["bare"], out["hits"], out["misses"]
    out["ratio_hit_rps_vs_bare"] = round(hits["requests_per_s"] / bare["requests_per_s"], 3)
    out["ratio_hit_p50_vs_bare"] = round(bare["p50_ms"] / hits["p50_ms"], 3)
    out["engine_peak_seq_per_s"] = round(peak, 1)
    out["misses_seeded_share"] = _seeded(miss_plan)
    out["ratio_miss_rps_vs_engine_peak"] = round(misses["requests_per_s"] / peak, 3)
    return out


def format_report(rep: dict[str, Any]) -> str:
    b, h, m = rep["bare"], rep["hits"], rep["misses"]
    rows = [
        ("bare FastAPI constant", b["requests_per_s"], b["p50_ms"], b["p99_ms"]),
        ("chunlian cache hits", h["requests_per_s"], h["p50_ms"], h["p99_ms"]),
        ("chunlian cache misses", m["requests_per_s"], m["p50_ms"], m["p99_ms"]),
    ]
    lines = [f"{'run':28s} {'req/s':>9s} {'p50 ms':>9s} {'p99 ms':>9s}"]
    lines += [f"{n:28s} {r:9.1f} {p50:9.1f} {p99:9.1f}" for n, r, p50, p99 in rows]
    for k, v in rep["engine"].items():
        lines.append(f"{'engine offline ' + k:28s} {v['steady_seq_per_s']:9.1f}  "
                     f"(steady; whole run {v['seq_per_s']:.1f})")
    lines.append(f"hit req/s vs bare   {rep['ratio_hit_rps_vs_bare']:.3f}  (target >= 0.7)")
    lines.append(f"hit p50 vs bare     {rep['ratio_hit_p50_vs_bare']:.3f}  (bare p50 / hit p50)")
    lines.append(f"miss req/s vs peak  {rep['ratio_miss_rps_vs_engine_peak']:.3f}  (target >= 0.85)")
    return "\n".join(lines)
