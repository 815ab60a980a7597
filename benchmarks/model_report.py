"""Everything the model issue asks to be measured, in one run, as JSON.

    python benchmarks/model_report.py --val runs/data/val.tsv --out runs/model_report.json

* ``eval``: every ``chunlian eval`` key on the validation split, with the random-real and
  gold baselines (the same code path as ``chunlian eval --baselines``);
* ``eval_beam``: the same with constrained beam search (``chunlian eval --beam 4``), and its
  one-request latency (``latency_beam_ms``);
* ``style_matrix``: per-style lexicon hit rate of lines generated under each style;
* ``hengpi``: agreement with the real 横批 on hengpi_triples.tsv against a random pick;
* ``latency_ms``: one request (greedy, batch of one) median and p90 over 50 upper lines;
* ``samples``: ten validation upper lines and five 藏头 couplets.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from chunlian.bench.common import percentile
from chunlian.model.styles import STYLES, lexicon_hit_rate
from chunlian.offline import OfflineGenerator, compose_request
from chunlian.training.eval_run import read_eval_pairs, run_eval
from chunlian.training.evaluate import hengpi_agreement
from chunlian.types import CoupletRequest


def style_matrix(gen: OfflineGenerator, uppers: list[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for style in STYLES:
        res = gen.generate([CoupletRequest(style=style, upper=u) for u in uppers])
        lowers = [r.best.lower for r in res if not isinstance(r, Exception)]
        out[style] = {lex: round(lexicon_hit_rate(lowers, lex), 4) for lex in STYLES}
    return out


def latency(gen: OfflineGenerator, uppers: list[str]) -> dict[str, float]:
    times: list[float] = []
    for u in uppers:
        t = time.perf_counter()
        gen.generate([CoupletRequest(upper=u)])
        times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "p90_ms": round(percentile(times, 90), 2),
            "mean_chars": round(sum(map(len, uppers)) / len(uppers), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--val", default="runs/data/val.tsv")
    ap.add_argument("--triples", default="../shared/data/couplets/hengpi_triples.tsv")
    ap.add_argument("--model-path", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report: dict[str, object] = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"}
    report["eval"] = run_eval(Path(args.val), args.limit, args.model_path, "cpu", baselines=True, batch_size=128)
    report["eval_beam"] = run_eval(Path(args.val), args.limit, args.model_path, "cpu", batch_size=128, beam=args.beam)
    gen = OfflineGenerator.load(args.model_path, "cpu", capacity=128)
    report["model"] = gen.loaded.tag
    report["params"] = gen.loaded.model.num_params()
    pairs = read_eval_pairs(Path(args.val), None)
    uppers = [u for u, _ in pairs]
    report["style_matrix"] = style_matrix(gen, uppers[:300])
    with open(args.triples, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    triples = [(r["upper"], r["lower"], r["hengpi"]) for r in rows]
    report["hengpi"] = hengpi_agreement(gen.hengpi, triples)  # type: ignore[arg-type]
    gen1 = OfflineGenerator(gen.loaded, type(gen.runner)(gen.loaded, 1), gen.hengpi)
    report["latency_ms"] = latency(gen1, uppers[:50])
    report["latency_beam_ms"] = latency(
        OfflineGenerator(gen.loaded, gen1.runner, gen.hengpi, beam_width=args.beam), uppers[:50]
    )
    samples = []
    for (u, ref), r in zip(pairs[100:110], gen.generate([CoupletRequest(upper=u) for u, _ in pairs[100:110]]), strict=True):
        if not isinstance(r, Exception):
            samples.append({"upper": u, "lower": r.best.lower, "hengpi": r.best.hengpi, "reference": ref})
    report["samples"] = samples
    composed = []
    for kw in [dict(heads="李明"), dict(heads="春华"), dict(heads="王芳", length=5), dict(keyword="新春"),
               dict(keyword="平安", style="family")]:
        r = gen.generate([compose_request(**kw)])[0]  # type: ignore[arg-type]
        if not isinstance(r, Exception):
            composed.append({"request": kw, "upper": r.best.upper, "lower": r.best.lower, "hengpi": r.best.hengpi})
    report["compose"] = composed
    text = json.dumps(report, ensure_ascii=False, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
