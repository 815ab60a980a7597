"""What one request costs the service's event loop, measured without the model.

On 2 cores the event loop and the engine share the CPU and the interpreter lock, so every
millisecond the loop spends on a cache miss is taken from decoding. This benchmark serves
the real app (routes, fast path, cache, metrics, engine and scheduler) over a *sleeping*
runner: each engine step sleeps ``--step-ms`` (the interpreter lock released, as torch
releases it) and finishes sequences after as many steps as a real 下联 has characters, so
the only CPU the server spends is the web side's and the scheduler's. It reports the CPU
time of the server's main thread (the event loop; ``/proc/<pid>/task/<pid>/stat``) per
request, for a cache-miss load and a cache-hit load at the same concurrency: CPU time, not
throughput, so that a noisy shared host changes it little.

``--compare-src DIR`` measures a second source tree too (e.g. a ``git worktree`` of an
older commit), alternating the two in every round, and prints the ratio::

    python benchmarks/event_loop_cost.py --rounds 3 --compare-src /tmp/wt_old/src

The server side of the benchmark is this file run with ``--serve PORT``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


# ---- the server side -------------------------------------------------------------------------
def serve(port: int, step_s: float) -> None:
    """The real app and engine over a runner whose steps sleep ``step_s`` (no torch)."""
    import uvicorn

    from chunlian.config import load_settings
    from chunlian.engine.engine import Engine
    from chunlian.engine.request import SeqOutput, SeqSpec

    class SleepingRunner:
        def __init__(self, capacity: int) -> None:
            self.capacity = capacity
            self.tokens_emitted = 0
            self.padded_batches = False
            self.live: dict[int, tuple[SeqSpec, int]] = {}

        def bind_thread(self) -> None:
            pass

        def step(self, specs: list[SeqSpec]) -> list[SeqOutput]:
            time.sleep(step_s)
            for s in specs:
                self.live[s.seq_id] = (s, 0)
            out = []
            for sid, (spec, done) in list(self.live.items()):
                self.tokens_emitted += 1
                if done + 1 >= spec.total_steps:
                    del self.live[sid]
                    out.append(SeqOutput(sid, spec.upper or "", "乙" * spec.upper_len, -1.0))
                else:
                    self.live[sid] = (spec, done + 1)
            return out

        def release(self, seq_ids: set[int] | list[int]) -> None:
            for sid in seq_ids:
                self.live.pop(sid, None)

    from chunlian.api.app import create_app

    settings = load_settings(port=port, warmup="", log_level="WARNING")
    engine = Engine(settings, SleepingRunner(settings.max_batch_size), None, "sleeping@bench")
    uvicorn.run(create_app(settings, engine), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


# ---- the measuring side ----------------------------------------------------------------------
def measure(src: Path | None, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Start a sleeping-runner server from ``src`` (None: the installed package), run a
    miss load then a hit load, and return the main thread's CPU per request of each."""
    from chunlian.bench.common import wait_until_ok
    from chunlian.bench.loadgen import run_load
    from chunlian.bench.plan import RequestPlan, load_lines
    from chunlian.bench.proccpu import host_steal_seconds, thread_cpu_seconds
    from chunlian.bench.sweep import free_port

    def loop_cpu_s() -> float:
        return thread_cpu_seconds(proc.pid, proc.pid) or 0.0

    port = free_port()
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.Popen([sys.executable, str(HERE), "--serve", str(port), "--step-ms", str(args.step_ms)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(proc, url, "/readyz", 60.0, "the sleeping-runner server")
        lines = load_lines(Path(args.data) if args.data else None)
        out: dict[str, Any] = {}
        for phase, unique in (("misses", 1.0), ("hits", 0.0)):
            plan = RequestPlan(lines, unique_ratio=unique, seed=seed)
            if phase == "hits":  # fill the hot set first: the measured window is all hits
                run_load(url, concurrency=args.concurrency, duration_s=1.0, plan=plan)
            cpu0, steal0 = loop_cpu_s(), host_steal_seconds() or 0.0
            res = run_load(url, concurrency=args.concurrency, duration_s=args.duration, plan=plan).report()
            cpu = loop_cpu_s() - cpu0
            n = max(1, int(res["requests"]))
            out[phase] = {"requests": res["requests"], "requests_per_s": res["requests_per_s"],
                          "loop_cpu_ms_per_request": round(1000 * cpu / n, 3),
                          "errors": res.get("errors", {}),
                          "steal_cores": round(((host_steal_seconds() or 0.0) - steal0) / args.duration, 2)}
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--step-ms", type=float, default=20.0, help="sleep of one engine step (default 20)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per phase (default 8)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", default=None, help="upper lines (default: the built-in sample)")
    ap.add_argument("--compare-src", type=Path, default=None,
                    help="a second source tree (its src/ directory) measured alternately")
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.step_ms / 1000)
        return
    sides: dict[str, Path | None] = {"current": None}
    if args.compare_src is not None:
        sides["compare"] = args.compare_src.resolve()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            runs[name].append(measure(sides[name], args, seed=r))
            print(f"round {r + 1} {name}: " + json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
    report: dict[str, Any] = {"step_ms": args.step_ms, "concurrency": args.concurrency,
                              "duration_s": args.duration, "rounds": args.rounds,
                              "compare_src": str(args.compare_src) if args.compare_src else None}
    for name, rs in runs.items():
        for phase in ("misses", "hits"):
            vals = [x[phase]["loop_cpu_ms_per_request"] for x in rs]
            report[f"{name}_{phase}_loop_cpu_ms"] = round(statistics.median(vals), 3)
            report[f"{name}_{phase}_loop_cpu_ms_by_round"] = vals
    if "compare" in runs:
        for phase in ("misses", "hits"):
            report[f"ratio_{phase}_compare_vs_current"] = round(
                report[f"compare_{phase}_loop_cpu_ms"] / report[f"current_{phase}_loop_cpu_ms"], 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
