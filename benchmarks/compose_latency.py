"""A composed couplet's latency alone: best against fast, and against another checkout.

    python benchmarks/compose_latency.py                          # this checkout
    python benchmarks/compose_latency.py --baseline-src /tmp/before/src --rounds 2

One service at a time (one engine, one torch thread, the result cache off) gets the campaign
set's most common names one request at a time, ``fast`` and ``best`` alternating name by name
(7 characters, traditional style, as the campaign page asks). Reports each mode's median and
p90 and best over fast; with ``--baseline-src`` the other checkout is measured the same way in
alternating rounds (this, baseline, baseline, this, ...), and the ratio of the best medians.
JSON to ``runs/compose_latency-DATE-TIME.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from chunlian.bench.common import percentile
from chunlian.bench.sweep import run_server

ROOT = Path(__file__).resolve().parents[1]
NAMES = ROOT / "data" / "campaign" / "names.tsv"
SETTINGS = {"cache_size": 0, "engine_replicas": 1, "torch_threads": 1, "idle_upgrade": "false"}


def names(count: int) -> list[str]:
    with NAMES.open(encoding="utf-8", newline="") as f:
        return [row["name"] for row in csv.DictReader(f, delimiter="\t")][:count]


def measure(url: str, people: list[str], warmup: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"fast": [], "best": []}
    with httpx.Client(base_url=url, timeout=60) as client:
        for k, name in enumerate(people):
            for quality in (("fast", "best") if k % 2 == 0 else ("best", "fast")):
                body = {"heads": name, "length": 7, "style": "traditional", "quality": quality}
                t0 = time.perf_counter()
                r = client.post("/v1/couplets/compose", json=body)
                took = time.perf_counter() - t0
                r.raise_for_status()
                if k >= warmup and r.json()["served"] == quality:
                    times[quality].append(took)
    out: dict[str, Any] = {q: {"median_ms": round(1000 * statistics.median(ts), 1),
                               "p90_ms": round(1000 * percentile(ts, 90), 1), "samples": len(ts)}
                           for q, ts in times.items()}
    out["best_over_fast"] = round(out["best"]["median_ms"] / out["fast"]["median_ms"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", type=int, default=40, help="the most common N names")
    ap.add_argument("--warmup", type=int, default=4, help="names asked first and not counted")
    ap.add_argument("--baseline-src", type=Path, help="another checkout's src/ to measure beside this one")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    people = names(args.names + args.warmup)
    sides: list[tuple[str, Path | None]] = [("this", None)]
    if args.baseline_src is not None:
        sides.append(("baseline", args.baseline_src))
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for label, src in sides if r % 2 == 0 else sides[::-1]:
            with run_server(SETTINGS, source=src) as srv:
                runs.append({"side": label, "round": r, **measure(srv.url, people, args.warmup)})
            print(json.dumps(runs[-1]), flush=True)
    report: dict[str, Any] = {"runs": runs, "settings": SETTINGS,
                              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    if args.baseline_src is not None:
        best = {s: statistics.median(x["best"]["median_ms"] for x in runs if x["side"] == s) for s, _ in sides}
        report["best_this_over_baseline"] = round(best["this"] / best["baseline"], 3)
    out = args.out or Path("runs") / time.strftime("compose_latency-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
