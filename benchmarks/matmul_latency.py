"""One request at a time under each ``matmul`` choice, interleaved rounds in one process.

Usage: ``python benchmarks/matmul_latency.py [--rounds 3] [--choices float32,float16,int8]``
prints one JSON object: per choice, each round's median and p90 over the first 50
validation upper lines (``latency()`` of ``model_report.py``: greedy with 横批, one KV-cache
row), and the machine. Rounds alternate the choices, so host drift hits all of them alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model_report import latency  # noqa: E402

from chunlian.engine.runner import ModelRunner  # noqa: E402
from chunlian.model.checkpoint import load_weights  # noqa: E402
from chunlian.offline import OfflineGenerator  # noqa: E402
from chunlian.training.eval_run import read_eval_pairs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--choices", default="float32,float16,int8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    uppers = [u for u, _ in read_eval_pairs(args.val, 50)]
    base = OfflineGenerator.load(None, "cpu", capacity=1)
    gens = {}
    for choice in args.choices.split(","):
        lm = load_weights(None, "cpu", choice)
        gens[choice] = OfflineGenerator(lm, ModelRunner(lm, 1), base.hengpi)
        latency(gens[choice], uppers[:10])  # warm
    rounds: dict[str, list[dict[str, float]]] = {c: [] for c in gens}
    for _ in range(args.rounds):
        for choice, gen in gens.items():
            rounds[choice].append(latency(gen, uppers))
    print(json.dumps({"machine": platform.processor() or platform.machine(), "threads": args.threads,
                      "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rounds": rounds}))


if __name__ == "__main__":
    main()
