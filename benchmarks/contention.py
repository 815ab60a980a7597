"""What a competitor for the cores costs the engine: offline continuous batching, alone and
beside a stand-in for the web side's work, in alternating rounds.

* ``alone``: the engine in this process, nothing else running;
* ``gil``: beside a Python thread of this process that holds the interpreter lock in bursts
  (``--burst-ms`` every ``--period-ms``), as the event loop does while it handles requests;
* ``proc``: beside a separate process with the same duty cycle (no lock shared).

Reported per round: sequences/s and the mean engine step (ms) at the mean row count. If
``gil`` and ``proc`` cost the same, the engine pays for the CPU time, not for the lock.

``--layout replicas`` measures the served layout instead (``engine.replicas``: one
single-threaded engine process per core, ``bench.engine.replicated_peak``, the denominator of
``chunlian bench service``'s miss ratio), alone and beside a separate process with the same
duty cycle (``proc``); the ``gil`` mode does not apply (the replicas share no lock with anyone).
``beside / alone`` is the most a served instance could reach against that peak if its web side
and load generator cost the engines nothing but the CPU they take.

    python benchmarks/contention.py --requests 2400 --rounds 2
    python benchmarks/contention.py --layout replicas --rows 64 --burst-ms 1 --period-ms 3.7 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from chunlian.bench.engine import http_requests
from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine, StepReport
from chunlian.engine.runner import ModelRunner, single_threaded_here
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.model.hengpi import HengpiSelector
from chunlian.types import CoupletRequest

BURNER = ("import time\nwhile True:\n    t = time.perf_counter()\n"
          "    while time.perf_counter() - t < {b}: pass\n    time.sleep({p} - {b})\n")


async def _run(loaded: LoadedModel, hengpi: HengpiSelector, reqs: list[CoupletRequest],
               rows: int, threads: int) -> dict[str, float]:
    s = EngineConfig.from_settings(load_settings(max_batch_size=rows, max_wait_ms=0,
                                                 max_queue_size=len(reqs) + 1, default_timeout_ms=600_000))
    eng = Engine(s, ModelRunner(loaded, capacity=rows, threads=threads), hengpi, loaded.tag)
    steps: list[StepReport] = []
    eng.add_step_listener(steps.append)
    await eng.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(eng.generate(r) for r in reqs))
    wall = time.perf_counter() - t0
    await eng.stop()
    mid = steps[len(steps) // 10: -len(steps) // 10] or steps  # without filling and draining
    return {"seq_per_s": round(len(reqs) / wall, 1),
            "step_ms": round(1000 * statistics.mean(r.step_s for r in mid), 2),
            "rows": round(statistics.mean(r.batch_size for r in mid), 1)}


def _measure(mode: str, burst_s: float, period_s: float, run: Any) -> dict[str, float]:
    stop = threading.Event()
    proc = None
    if mode == "gil":
        def hold() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                while time.perf_counter() - t < burst_s:
                    pass  # pure Python: holds the interpreter lock
                time.sleep(period_s - burst_s)
        threading.Thread(target=hold, daemon=True).start()
    elif mode == "proc":
        proc = subprocess.Popen([sys.executable, "-c", BURNER.format(b=burst_s, p=period_s)])
    try:
        return run()  # type: ignore[no-any-return]
    finally:
        stop.set()
        if proc is not None:
            proc.kill()
            proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--burst-ms", type=float, default=1.0)
    ap.add_argument("--period-ms", type=float, default=10.0)
    ap.add_argument("--layout", choices=("engine", "replicas"), default="engine",
                    help="engine: one engine in this process (default); replicas: the served "
                         "layout, one single-threaded engine process per core")
    ap.add_argument("--replicas", type=int, default=2, help="engine processes, with --layout replicas")
    args = ap.parse_args()
    if not 0 < args.burst_ms < args.period_ms:
        ap.error(f"expected 0 < --burst-ms < --period-ms, got {args.burst_ms} and {args.period_ms}")
    if args.layout == "replicas":
        _replicas_main(args)
        return
    single_threaded_here()
    loaded = load_weights(None, "cpu")
    hengpi = HengpiSelector.from_loaded(loaded)
    reqs = http_requests(args.requests, seeded_share=1.0)  # what a long served miss run sends
    def run() -> dict[str, float]:
        return asyncio.run(_run(loaded, hengpi, reqs, args.rows, args.threads))
    out: dict[str, list[dict[str, float]]] = {"alone": [], "gil": [], "proc": []}
    for r in range(args.rounds):
        for mode in out if r % 2 == 0 else reversed(list(out)):
            out[mode].append(_measure(mode, args.burst_ms / 1000, args.period_ms / 1000, run))
            print(mode, out[mode][-1], file=sys.stderr)
    print(json.dumps({"meta": vars(args), "rounds": out}, indent=1))


def _replicas_main(args: argparse.Namespace) -> None:
    from chunlian.bench.engine import replicated_peak

    def run() -> dict[str, float]:
        r = replicated_peak(None, args.rows, args.requests, args.replicas, 1, "http", seeded_share=1.0)
        return {"steady_seq_per_s": r["steady_seq_per_s"], "seq_per_s": r["seq_per_s"]}
    out: dict[str, list[dict[str, float]]] = {"alone": [], "proc": []}
    for r in range(args.rounds):
        for mode in out if r % 2 == 0 else reversed(list(out)):
            out[mode].append(_measure(mode, args.burst_ms / 1000, args.period_ms / 1000, run))
            print(mode, out[mode][-1], file=sys.stderr)
    ceilings = [round(b["steady_seq_per_s"] / a["steady_seq_per_s"], 3)
                for a, b in zip(out["alone"], out["proc"], strict=True)]
    print(json.dumps({"meta": vars(args), "competitor_cores": round(args.burst_ms / args.period_ms, 3),
                      "rounds": out, "beside_vs_alone_by_round": ceilings}, indent=1))


if __name__ == "__main__":
    main()
