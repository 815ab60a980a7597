"""The idle upgrade measured with a replayed trace: a peak, a quiet hour, then a peak again.

    python benchmarks/idle_upgrade.py                  # the defaults below (about 4 minutes)
    python benchmarks/idle_upgrade.py --rounds 2 --quiet-s 90

One trace, replayed against a fresh service (empty in-process cache, default settings)
with ``CHUNLIAN_IDLE_UPGRADE`` off and then on (``--rounds`` alternates the pair):

* requests are ``auto``, Poisson arrivals; each line is drawn from a Zipf law (exponent
  ``--zipf``) over ``--lines`` validation lines, or, with probability ``--fresh``, is a line
  asked only once;
* ``evening``: ``--peak-rate`` requests/s for ``--peak-s``: ``auto`` steps down and most
  answers are greedy, and are cached so;
* ``quiet``: ``--quiet-rate`` requests/s for ``--quiet-s`` (the trace's quiet hour, scaled
  down), with a probe beside it: fresh lines asked ``quality: fast`` at ``--probe-rate``,
  whose latency is the fast path's (every probe is a live request the upgrade must give way to);
* ``peak``: the evening's load again, with the same law.

Reports, for each service: the share of the peak's answers served best (cache hits
included), the fast probes' p50 and p99, and the idle upgrade's counters; then the ratios
with against without. JSON to ``runs/idle_upgrade-DATE-TIME.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from quality_serving import Client, arrivals

from chunlian.bench.common import percentile
from chunlian.bench.promtext import metric, parse_metrics
from chunlian.bench.sweep import run_server
from chunlian.training.eval_run import read_eval_pairs


class Trace:
    """The request bodies of one replay, drawn from fixed seeds (the same for every service)."""

    def __init__(self, uppers: list[str], args: argparse.Namespace) -> None:
        self.hot = uppers[: args.lines]
        self.fresh = iter(uppers[args.lines:])
        self.weights = [1.0 / (k + 1) ** args.zipf for k in range(len(self.hot))]
        self.fresh_share = args.fresh
        self.rng = random.Random(57)

    def body(self) -> dict[str, Any]:
        if self.rng.random() < self.fresh_share:
            return {"upper": next(self.fresh)}
        return {"upper": self.rng.choices(self.hot, self.weights)[0]}

    def probe(self) -> dict[str, Any]:
        return {"upper": next(self.fresh), "quality": "fast"}


def served_share(results: list[tuple[float, int, str]]) -> dict[str, Any]:
    ok = [s for _, code, s in results if code == 200]
    counts = Counter(ok)
    return {"requests": len(results), "answered": len(ok), "served": dict(counts),
            "best_share": round(counts.get("best", 0) / max(1, len(ok)), 3)}


def latency(results: list[tuple[float, int, str]]) -> dict[str, Any]:
    ok = [t for t, code, _ in results if code == 200]
    return {"requests": len(results), "answered": len(ok),
            "p50_ms": round(1000 * percentile(ok, 50), 1) if ok else None,
            "p99_ms": round(1000 * percentile(ok, 99), 1) if ok else None}


def upgrade_counters(url: str) -> dict[str, float]:
    samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return {o: metric(samples, "chunlian_idle_upgrades_total", outcome=o)
            for o in ("upgraded", "yielded", "skipped", "failed")}


async def replay(url: str, trace: Trace, args: argparse.Namespace) -> dict[str, Any]:
    http = Client(url)
    evening = await arrivals(http, trace.body, args.peak_rate, args.peak_s, 1)
    quiet_task = asyncio.ensure_future(arrivals(http, trace.body, args.quiet_rate, args.quiet_s, 2))
    probes = await arrivals(http, trace.probe, args.probe_rate, args.quiet_s, 3)
    quiet = await quiet_task
    peak = await arrivals(http, trace.body, args.peak_rate, args.peak_s, 4)
    return {"evening": served_share(evening), "quiet": served_share(quiet), "fast_probes": latency(probes),
            "peak": served_share(peak), "idle_upgrades": upgrade_counters(url)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--lines", type=int, default=500, help="the lines that repeat (Zipf over them)")
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--fresh", type=float, default=0.3, help="share of requests for a line asked once")
    ap.add_argument("--peak-rate", type=float, default=80.0)
    ap.add_argument("--peak-s", type=float, default=20.0)
    ap.add_argument("--quiet-rate", type=float, default=1.0)
    ap.add_argument("--quiet-s", type=float, default=60.0)
    ap.add_argument("--probe-rate", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=1, help="pairs of replays, off then on (alternating)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    uppers = list(dict.fromkeys(u for u, _ in read_eval_pairs(args.val, None)))
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for on in order:
            trace = Trace(uppers, args)
            with run_server({"idle_upgrade": str(on).lower()}) as srv:
                rep = asyncio.run(replay(srv.url, trace, args))
            runs.append({"idle_upgrade": on, **rep})
            print(json.dumps(runs[-1], ensure_ascii=False), flush=True)

    def mean(on: bool, pick: Callable[[dict[str, Any]], float]) -> float:
        vals = [float(pick(x)) for x in runs if x["idle_upgrade"] == on]
        return sum(vals) / len(vals)

    off_p99, on_p99 = (mean(o, lambda x: x["fast_probes"]["p99_ms"]) for o in (False, True))
    report = {
        "runs": runs,
        "peak_best_share": {"without": round(mean(False, lambda x: x["peak"]["best_share"]), 3),
                            "with": round(mean(True, lambda x: x["peak"]["best_share"]), 3)},
        "fast_probe_p99_ms": {"without": round(off_p99, 1), "with": round(on_p99, 1),
                              "with_over_without": round(on_p99 / off_p99, 3)},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    out = args.out or Path("runs") / time.strftime("idle_upgrade-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
