"""One request at a time: greedy (the service's answer) against the offline quality preset.

    python benchmarks/quality_latency.py --val runs/data/val.tsv --lines 50 --rounds 2
    python benchmarks/quality_latency.py --against OTHER-rev.safetensors   # two reverse weights

The generators are loaded once; each round times every line alone with each in turn (the
order reverses every other round), so a drifting host moves them alike. Prints JSON: median
and p90 milliseconds per mode and round, and the ratios of the medians. ``--against`` adds
the quality preset on other reverse-trained weights ("quality-against").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from model_report import latency  # this script's folder is on sys.path: one timing loop for both

from chunlian.offline import QUALITY, OfflineGenerator
from chunlian.training.eval_run import read_eval_pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--lines", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--against", type=Path, default=None,
                    help="also time the quality preset on these reverse-trained weights")
    args = ap.parse_args()
    uppers = [u for u, _ in read_eval_pairs(args.val, args.lines)]
    gens = {
        "greedy": OfflineGenerator.load(None, "cpu", capacity=1),
        "quality": OfflineGenerator.load_quality("cpu", capacity=64),
    }
    if args.against is not None:
        gens["quality-against"] = OfflineGenerator.load_quality("cpu", capacity=64, model_path=args.against)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in gens}
    for r in range(args.rounds):
        for name in (list(gens) if r % 2 == 0 else list(reversed(gens))):
            rounds[name].append(latency(gens[name], uppers))
    med = {name: statistics.median(x["median_ms"] for x in rs) for name, rs in rounds.items()}
    report = {"lines": len(uppers), "preset": QUALITY.as_dict(), "rounds": rounds,
              "models": {name: g.loaded.tag for name, g in gens.items()},
              "quality_vs_greedy_median": round(med["quality"] / med["greedy"], 1)}
    if "quality-against" in med:
        report["quality_vs_against_median"] = round(med["quality"] / med["quality-against"], 2)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
