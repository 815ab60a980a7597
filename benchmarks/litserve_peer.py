"""chunlian against LitServe serving the same model, same load, same host.

    pip install -e '.[peer]'      # litserve (no torch of its own: the pinned CPU one is used)
    python benchmarks/litserve_peer.py --concurrency 64 256 --duration-s 20 --rounds 2

In each of ``--rounds`` rounds, each server in turn is started alone on a loopback port and
driven at every concurrency by the project's closed-loop load generator
(``chunlian.bench.loadgen``): ``--warmup-s`` of unmeasured load, then a ``--duration-s``
window; then it is stopped. The side that goes first alternates from round to round, and the
figures are the rounds' means, with each round's ratio kept: on a shared host the speed
drifts between one minute and the next.

Both sides answer the same requests in the same order: every request fresh (a ``RequestPlan``
with ``seed=1``: real lines, every style, each with its own sampling seed), and chunlian's
result cache off (``CHUNLIAN_CACHE_SIZE=0``), so every answer is generated.

Same model, processes and threads on both sides:

* chunlian: ``python -m chunlian.api`` (what ``chunlian serve`` runs) with
  ``CHUNLIAN_DEVICE=cpu``, ``CHUNLIAN_ENGINE_REPLICAS=W``, ``CHUNLIAN_TORCH_THREADS=T`` and
  ``CHUNLIAN_MAX_BATCH_SIZE=B``: W engine processes of T torch threads and ``B / W`` rows each (continuous batching), behind
  one web process.
* LitServe: ``benchmarks/litserve_app.py``: ``workers_per_device=W`` inference processes on
  ``accelerator="cpu"``, each with T torch threads and one ``ModelRunner`` of ``B / W`` rows
  (chunlian's ``OfflineGenerator``), LitServe's dynamic batching with ``max_batch_size=B / W``
  and ``batch_timeout`` = chunlian's ``max_wait_ms``, and LitServe's default HTTP side (one
  API server process per inference worker) unless ``--api-servers``.

A request's deadline is ``--timeout-s`` on both sides (chunlian's ``default_timeout_ms``, which
counts the whole request; LitServe's ``timeout``, which counts its queue wait): 504 past it.

W and T default to what chunlian resolves on this host (one single-threaded replica per
core). Prints requests/s, p50, p99, errors and answers per CPU second of each server's process
tree for each side, and the ratios chunlian/LitServe for each concurrency; the raw reports go to
``runs/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chunlian.bench.common import mean_fields
from chunlian.bench.loadgen import run_load
from chunlian.bench.plan import RequestPlan, load_lines
from chunlian.bench.spawn import serving
from chunlian.bench.sweep import run_server
from chunlian.cluster.procs import free_port
from chunlian.config import load_settings

APP = Path(__file__).with_name("litserve_app.py")
SIDES = ("chunlian", "litserve")
INSTALL_HINT = "LitServe is not installed: pip install -e '.[peer]'"


@contextmanager
def litserve_server(args: argparse.Namespace, ready_limit_s: float = 180.0) -> Iterator[tuple[str, int]]:
    """Start ``litserve_app.py`` (its own process group: its API servers and inference
    workers); yield (url, pid); stop the whole group (``bench.spawn``)."""
    port = free_port()
    cmd = [sys.executable, str(APP), "--port", str(port), "--workers", str(args.workers),
           "--threads", str(args.threads), "--max-batch-size", str(args.rows),
           "--batch-timeout-s", str(args.max_wait_ms / 1000), "--timeout-s", str(args.timeout_s)]
    if args.api_servers:
        cmd += ["--api-servers", str(args.api_servers)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNLIAN_")}
    with serving(cmd, port, what="the LitServe app", ready_path="/health", limit_s=ready_limit_s,
                 env=env, temp_log=True, own_session=True) as srv:
        yield srv.url, srv.pid


def measure(url: str, pid: int, concurrency: int, args: argparse.Namespace, label: str) -> dict[str, Any]:
    plan = RequestPlan(load_lines(args.data), unique_ratio=1.0, seed=1)
    res = run_load(url, concurrency, args.duration_s, 1_000_000, plan, warmup_s=args.warmup_s,
                   timeout_s=args.timeout_s + 10, server_pid=pid, progress=not args.no_progress, label=label)
    rep: dict[str, Any] = res.report()
    return rep


@contextmanager
def server(side: str, args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """One side's server, alone on a loopback port: (url, pid of its process tree's root)."""
    if side == "litserve":
        with litserve_server(args) as up:
            yield up
        return
    settings = {"device": "cpu", "cache_size": 0, "engine_replicas": args.workers, "torch_threads": args.threads,
                "max_batch_size": args.rows * args.workers, "max_wait_ms": args.max_wait_ms,
                "default_timeout_ms": round(args.timeout_s * 1000)}
    with run_server(settings, source=args.baseline_src if side == "baseline" else None) as srv:
        yield srv.url, srv.pid


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds at one concurrency: numbers averaged, counts and errors summed."""
    out: dict[str, Any] = mean_fields(reports, summed=("requests", "ok", "unfinished"))
    errors: dict[str, int] = {}
    for r in reports:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n
    out["errors"] = errors
    out["requests_per_s_by_round"] = [r["requests_per_s"] for r in reports]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``--rounds`` rounds; in each, each side is started once and measured at every
    concurrency; the side that goes first alternates from round to round."""
    sides = (*SIDES, "baseline") if args.baseline_src else SIDES
    reports: dict[str, dict[int, list[dict[str, Any]]]] = {
        side: {c: [] for c in args.concurrency} for side in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            with server(side, args) as (url, pid):
                for c in args.concurrency:
                    reports[side][c].append(measure(url, pid, c, args, f"{side} c={c} round {r + 1}"))
    out: dict[str, Any] = {"meta": meta(args), "runs": {}}
    for c in args.concurrency:
        ch, ls = summary(reports["chunlian"][c]), summary(reports["litserve"][c])
        out["runs"][str(c)] = {
            "chunlian": ch, "litserve": ls,
            "ratio_rps_chunlian_vs_litserve": ratio(ch["requests_per_s"], ls["requests_per_s"]),
            "ratio_rps_by_round": [ratio(a["requests_per_s"], b["requests_per_s"]) for a, b in
                                   zip(reports["chunlian"][c], reports["litserve"][c], strict=True)],
            # answers per CPU second of the server's process tree: the share of the cores a
            # server gets on a shared host moves with the neighbours, its cost per answer less
            "ratio_per_cpu_s_chunlian_vs_litserve": ratio(ch.get("requests_per_cpu_s"),
                                                          ls.get("requests_per_cpu_s")),
            "ratio_p50_chunlian_vs_litserve": ratio(ch["p50_ms"], ls["p50_ms"]),
            "ratio_p99_chunlian_vs_litserve": ratio(ch["p99_ms"], ls["p99_ms"]),
            "rounds": {side: reports[side][c] for side in sides},
        }
        if args.baseline_src:  # the same service from another checkout, measured alongside
            base = summary(reports["baseline"][c])
            out["runs"][str(c)].update({
                "baseline": base,
                "ratio_rps_chunlian_vs_baseline": ratio(ch["requests_per_s"], base["requests_per_s"]),
                "ratio_p99_chunlian_vs_baseline": ratio(ch["p99_ms"], base["p99_ms"]),
                "ratio_rps_baseline_vs_litserve": ratio(base["requests_per_s"], ls["requests_per_s"]),
            })
    return out


def meta(args: argparse.Namespace) -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith("Model name")), None)
    return {"date": time.strftime("%Y-%m-%d"), "cpu_model": cpu, "cpus": os.cpu_count(),
            "litserve": importlib.metadata.version("litserve"),
            "torch": importlib.metadata.version("torch"),
            "workers": args.workers, "torch_threads": args.threads, "rows_per_worker": args.rows,
            "max_wait_ms": args.max_wait_ms, "timeout_s": args.timeout_s,
            "api_servers": args.api_servers or args.workers,
            "duration_s": args.duration_s, "warmup_s": args.warmup_s, "rounds": args.rounds,
            "concurrency": args.concurrency, "plan": "fresh, seeded (RequestPlan seed=1)",
            "chunlian_cache": "off (CHUNLIAN_CACHE_SIZE=0)",
            "baseline_src": str(args.baseline_src) if args.baseline_src else None}


def format_report(rep: dict[str, Any]) -> str:
    rows = [f"{'server':10s} {'c':>4s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s} "
            f"{'srv cores':>9s} {'req/CPU-s':>9s} {'other':>6s}"]
    for c, run in rep["runs"].items():
        for side in ("chunlian", "litserve", "baseline"):
            if side not in run:
                continue
            r = run[side]
            rows.append(f"{side:10s} {c:>4s} {r['requests_per_s']:8.1f} {r['p50_ms'] or 0:8.1f} "
                        f"{r['p99_ms'] or 0:8.1f} {sum(r['errors'].values()):7d} "
                        f"{r.get('server_cpu_cores') or 0:9.2f} {r.get('requests_per_cpu_s') or 0:9.1f} "
                        f"{r.get('host_other_cores') or 0:6.2f}")
        rows.append(f"  c={c} chunlian/LitServe: req/s {run['ratio_rps_chunlian_vs_litserve']}x "
                    f"(rounds {run['ratio_rps_by_round']}), req/CPU-s "
                    f"{run['ratio_per_cpu_s_chunlian_vs_litserve']}x, "
                    f"p50 {run['ratio_p50_chunlian_vs_litserve']}x, p99 {run['ratio_p99_chunlian_vs_litserve']}x")
        if "baseline" in run:
            rows.append(f"  c={c} chunlian/baseline: req/s {run['ratio_rps_chunlian_vs_baseline']}x, "
                        f"p99 {run['ratio_p99_chunlian_vs_baseline']}x; baseline/LitServe: req/s "
                        f"{run['ratio_rps_baseline_vs_litserve']}x")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    served = load_settings(device="cpu")  # LitServe's side runs on the CPU: so does chunlian's
    workers = served.resolved_engine_replicas()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    p.add_argument("--duration-s", type=float, default=20.0, help="measured window per run")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the first side alternating (default 2)")
    p.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured load before each window")
    p.add_argument("--workers", type=int, default=workers,
                   help=f"model processes on each side (default {workers}: chunlian's on this host)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of each (default: chunlian's)")
    p.add_argument("--rows", type=int, default=None,
                   help="batch rows of each model process (default: chunlian's max_batch_size / workers)")
    p.add_argument("--max-wait-ms", type=float, default=served.max_wait_ms,
                   help="chunlian's max_wait_ms and LitServe's batch_timeout")
    p.add_argument("--timeout-s", type=float, default=30.0,
                   help="a request's deadline on both sides: chunlian's default_timeout_ms, LitServe's timeout "
                        "(default 30, LitServe's own)")
    p.add_argument("--api-servers", type=int, default=None, help="LitServe HTTP processes (default: its own)")
    p.add_argument("--data", type=Path, default=None, help="upper lines (default: the built-in sample)")
    p.add_argument("--out", type=Path, default=None, help="raw JSON (default runs/litserve_peer-DATE.json)")
    p.add_argument("--baseline-src", type=Path, default=None,
                   help="also serve chunlian from this checkout's src/ folder (another version), "
                        "measured in the same rounds")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.workers < 1 or min(args.concurrency) < 1:
        p.error("--rounds, --workers and --concurrency must be >= 1")
    if args.duration_s <= 0 or args.timeout_s <= 0:
        p.error("--duration-s and --timeout-s must be > 0")
    args.threads = args.threads or served.resolved_replica_threads(args.workers)
    args.rows = args.rows or max(1, served.max_batch_size // args.workers)
    return args


def main() -> int:
    import importlib.util

    if importlib.util.find_spec("litserve") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    args = parse_args()
    rep = run(args)
    out = args.out or Path("runs") / f"litserve_peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=2, ensure_ascii=False) + "\n")
    print(format_report(rep))
    print(f"raw: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
