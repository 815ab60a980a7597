"""What one best answer costs, in thread CPU time: robust to a busy host, comparable across checkouts.

    python benchmarks/best_cost.py --lines 40                  # this checkout
    PYTHONPATH=/tmp/before/src python benchmarks/best_cost.py  # another one, for before/after
    py-spy record -r 200 -f raw -o runs/best.txt -- python benchmarks/best_cost.py --only best

One request at a time, greedy (the service's fast answer) and the offline quality preset (the
best mode's search and rescoring) alternating line by line, one torch thread: the median thread
CPU milliseconds of each and their ratio. Then each rescoring model alone on every line's best
``rescore_top`` search lines (one request's lines a call): median milliseconds a request.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from chunlian.engine.channel import ChannelScorer
from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS, load_weights
from chunlian.offline import QUALITY, OfflineGenerator, couplet_request
from chunlian.training.eval_run import read_eval_pairs


def cpu_ms(fn: Callable[..., object], *args: object) -> float:
    t = time.thread_time()
    fn(*args)
    return (time.thread_time() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--only", choices=("best", "all"), default="all", help="best: only the best answers (profiling)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    uppers = [u for u, _ in read_eval_pairs(args.val, args.lines)]
    gens = {"greedy": OfflineGenerator.load(None, "cpu", capacity=1), "best": OfflineGenerator.load_quality("cpu", 64)}
    if args.only == "best":
        del gens["greedy"]
    for g in gens.values():
        g.generate([couplet_request(uppers[0])])
    per: dict[str, list[float]] = {k: [] for k in gens}
    for u in uppers:
        for k, g in gens.items():
            per[k].append(cpu_ms(g.generate, [couplet_request(u)]))
    report: dict[str, object] = {"lines": len(uppers), "median_cpu_ms": {k: round(statistics.median(v), 1)
                                                                     for k, v in per.items()}}
    if args.only == "all":
        med = report["median_cpu_ms"]
        assert isinstance(med, dict)
        report["best_over_greedy"] = round(med["best"] / med["greedy"], 2)
        lines = gens["best"].beam_nbest([(u, "traditional") for u in uppers], QUALITY.width)
        jobs = [[(u, h.lower, "traditional") for h in hyps[: QUALITY.rescore_top]] for u, hyps in zip(uppers, lines, strict=True)]
        for name, weights, forward in (("channel", QUALITY_WEIGHTS, False), ("forward", DEFAULT_WEIGHTS, True)):
            scorer = ChannelScorer(load_weights(weights, "cpu"), forward=forward)
            report[f"{name}_score_cpu_ms"] = round(statistics.median(
                cpu_ms(scorer.score, j) for j in jobs), 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
