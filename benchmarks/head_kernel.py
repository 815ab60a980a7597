"""The LM head on oneDNN (``model.onednn``, the default) against PyTorch's kernel, side by side.

Usage: ``python benchmarks/head_kernel.py [--rounds 6] [--answers 2000] [--quality-lines 32]``
prints one JSON object:

* ``answers``: greedy 下联 of the first ``--answers`` validation lines at 128 rows under
  both heads, and of the first 100 one at a time: how many are the same (the claim is all);
* ``rounds``: per round and head, sequences/s over 256 lines of the 800-line benchmark mix at
  128 rows (``OfflineGenerator``, the runner without the async engine), and the median of a
  lone request over 50 validation lines; rounds alternate the order of the heads, and the
  lone requests alternate line by line, so host drift hits both alike. ``paired`` holds each
  round's ratio (oneDNN / PyTorch);
* ``quality`` (with ``--quality-lines``): the offline quality mode (beam 32 and two scoring
  passes, where the head runs at 32 to ~1,000 rows) on those lines, each head, answers compared.

The PyTorch side is the same loaded model with ``lm_head = None`` (the tied embedding
through ``F.linear``, PyTorch's own kernel).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from chunlian.bench.engine import mixed_lines
from chunlian.engine.runner import ModelRunner
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.offline import OfflineGenerator
from chunlian.training.eval_run import read_eval_pairs
from chunlian.types import CoupletRequest

HEADS = ("onednn", "pytorch")


def plain(loaded: LoadedModel) -> LoadedModel:
    loaded.model.lm_head = None
    return loaded


def lowers(gen: OfflineGenerator, uppers: list[str], alone: bool = False) -> list[str]:
    batches = [[u] for u in uppers] if alone else [uppers]
    out: list[str] = []
    for b in batches:
        for r in gen.generate([CoupletRequest(upper=u) for u in b]):
            out.append(r.best.lower if not isinstance(r, Exception) else f"error: {r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--answers", type=int, default=2000)
    ap.add_argument("--quality-lines", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    val = [u for u, _ in read_eval_pairs(args.val, max(args.answers, 100))]
    base = OfflineGenerator.load(None, "cpu", capacity=1)
    models = {"onednn": load_weights(None, "cpu"), "pytorch": plain(load_weights(None, "cpu"))}
    big = {h: OfflineGenerator(m, ModelRunner(m, 128), base.hengpi) for h, m in models.items()}
    one = {h: OfflineGenerator(m, ModelRunner(m, 1), base.hengpi) for h, m in models.items()}
    report: dict[str, object] = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
                                 "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    batched = {h: lowers(g, val[: args.answers]) for h, g in big.items()}
    alone = {h: lowers(g, val[:100], alone=True) for h, g in one.items()}
    report["answers"] = {
        "batched_lines": args.answers,
        "batched_same": sum(a == b for a, b in zip(batched["onednn"], batched["pytorch"], strict=True)),
        "alone_lines": 100,
        "alone_same": sum(a == b for a, b in zip(alone["onednn"], alone["pytorch"], strict=True)),
        "alone_same_as_batched_onednn": sum(a == b for a, b in zip(alone["onednn"], batched["onednn"], strict=False)),
    }
    mix = [CoupletRequest(upper=u) for u in mixed_lines(768)]
    lone_lines = val[:50]
    rounds: list[dict[str, float]] = []
    for rnd in range(args.rounds):
        chunk = mix[(rnd % 3) * 256 : (rnd % 3) * 256 + 256]
        row: dict[str, float] = {}
        for h in HEADS if rnd % 2 == 0 else HEADS[::-1]:
            t = time.perf_counter()
            big[h].generate(chunk)
            row[f"{h}_seq_per_s"] = round(len(chunk) / (time.perf_counter() - t), 1)
        times: dict[str, list[float]] = {h: [] for h in HEADS}
        for i, u in enumerate(lone_lines):
            for h in HEADS if (rnd + i) % 2 == 0 else HEADS[::-1]:
                t = time.perf_counter()
                one[h].generate([CoupletRequest(upper=u)])
                times[h].append((time.perf_counter() - t) * 1000)
        for h in HEADS:
            row[f"{h}_lone_median_ms"] = round(statistics.median(times[h]), 2)
        row["seq_ratio"] = round(row["onednn_seq_per_s"] / row["pytorch_seq_per_s"], 3)
        row["lone_ratio"] = round(row["onednn_lone_median_ms"] / row["pytorch_lone_median_ms"], 3)
        rounds.append(row)
    report["rounds"] = rounds
    report["paired"] = {k: {"median": statistics.median(r[k] for r in rounds),
                            "min": min(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
                        for k in ("seq_ratio", "lone_ratio")}
    if args.quality_lines:
        report["quality"] = quality(val[: args.quality_lines])
    print(json.dumps(report))


def quality(uppers: list[str]) -> dict[str, object]:
    """The offline quality mode over ``uppers`` with each head, one after the other."""
    out: dict[str, object] = {"lines": len(uppers)}
    answers: dict[str, list[str]] = {}
    for h in HEADS:
        gen = OfflineGenerator.load_quality(capacity=128)
        if h == "pytorch":
            for m in (gen.loaded, *gen.rescorers):
                plain(m)
        t = time.perf_counter()
        answers[h] = lowers(gen, uppers)
        out[f"{h}_s"] = round(time.perf_counter() - t, 2)
    out["same"] = sum(a == b for a, b in zip(answers["onednn"], answers["pytorch"], strict=True))
    return out


if __name__ == "__main__":
    main()
