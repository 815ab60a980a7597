"""Overload against another version of the service: many connections, no cache, alternating rounds.

    git worktree add /tmp/before 28c7863
    python benchmarks/overload_against.py --baseline-src /tmp/before/src --rounds 2

Each round starts this checkout's service and the other one (``--baseline-src``: its ``src/``
folder) in turn, on the defaults with the result cache off (``CHUNLIAN_CACHE_SIZE=0``), and
drives each with ``chunlian bench http`` at ``--concurrency`` connections of fresh lines
(``--unique-ratio 1``: nothing repeats, nothing coalesces). The order swaps every other
round, so a drifting host moves both sides alike. Prints JSON: each side's requests/s and p99
per round, and this checkout's requests/s over the baseline's, per round and overall.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chunlian.bench.sweep import run_server


def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``chunlian bench http`` run against ``url`` (its JSON report)."""
    cmd = [sys.executable, "-c", "import sys; from chunlian.cli import main; sys.exit(main())",
           "bench", "http", "--url", url, "--concurrency", str(args.concurrency),
           "--duration-s", str(args.duration_s), "--warmup-s", str(args.warmup_s),
           "--unique-ratio", "1", "--no-progress", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rep: dict[str, Any] = json.loads(out)
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-src", type=Path, required=True, help="the other checkout's src/ folder")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--duration-s", type=float, default=15.0)
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sides: dict[str, Path | None] = {"head": None, "baseline": args.baseline_src}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            with run_server({"cache_size": 0}, source=sides[name]) as srv:
                rep = drive(srv.url, args)
            rounds[name].append({k: rep.get(k) for k in (
                "requests_per_s", "p50_ms", "p99_ms", "ok", "overload_rejections", "deadline_drops",
                "host_other_cores")})
            print(f"round {r + 1} {name}: {rep['requests_per_s']} requests/s", file=sys.stderr)
    per_round = [round(h["requests_per_s"] / b["requests_per_s"], 3)
                 for h, b in zip(rounds["head"], rounds["baseline"], strict=True)]
    report = {"concurrency": args.concurrency, "baseline_src": str(args.baseline_src), "rounds": rounds,
              "head_over_baseline_per_round": per_round,
              "head_over_baseline": round(statistics.mean(h["requests_per_s"] for h in rounds["head"])
                                          / statistics.mean(b["requests_per_s"] for b in rounds["baseline"]), 3)}
    text = json.dumps(report, indent=2)
    print(text)
    out = args.out or Path("runs") / f"overload_against-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
