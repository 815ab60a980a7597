"""Decoding-time biases for the served greedy answer, on one half of the validation split.

Two soft biases added to the constrained logits (``model.decoding.Constrainer``'s table) and
scored by BLEU-4 and 平仄 opposition over the greedy answers:

* ``tone_bias``: the 平仄 opposition bias the runner already has (default 2.0);
* ``lam``: an *anti-language-model* correction (Li et al., 2016, MMI-antiLM) with a unigram
  prior: ``- lam * log p_train(char)``, from the training split's 下联 characters, which
  penalises the generic characters a greedy decoder over-uses.

Choose on half a (``--half a``, the same seeded halves as ``benchmarks/channel_sweep.py``),
report half b. On the shipped weights no cell beats the shipped setting beyond the noise
(``docs/performance.md``), so the service keeps it.

    python benchmarks/greedy_bias_sweep.py --half a --grid 2:0 2:0.1 2:0.2 2:0.3 1:0 1.5:0 2.5:0
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from chunlian.data.corpus import read_pairs
from chunlian.errors import ChunlianError, InvalidInput
from chunlian.model.decoding import Constrainer
from chunlian.offline import OfflineGenerator
from chunlian.text import is_han, validate_upper
from chunlian.training.evaluate import compute_metrics
from chunlian.types import CoupletRequest


def half_pairs(data: Path, half: str, seed: int) -> list[tuple[str, str]]:
    rows = [p for p in read_pairs(data) if p.register == "modern"]
    random.Random(seed).shuffle(rows)
    rows = rows[: len(rows) // 2] if half == "a" else rows[len(rows) // 2:] if half == "b" else rows
    pairs = []
    for p in rows:
        try:
            pairs.append((validate_upper(p.upper), p.lower))
        except InvalidInput:
            continue
    return pairs


def log_unigram(train: Path, itos: list[str]) -> torch.Tensor:
    """``log p(char)`` over the vocabulary from the training split's modern 下联 [V]."""
    counts: Counter[str] = Counter()
    for p in read_pairs(train):
        if p.register == "modern":
            counts.update(ch for ch in p.lower if is_han(ch))
    total = sum(counts.values())
    return torch.tensor([math.log(counts[ch] / total) if counts[ch] else math.log(0.5 / total) for ch in itos])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--train", type=Path, default=Path("runs/data/train.tsv"))
    ap.add_argument("--half", choices=["a", "b", "all"], default="a")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--grid", nargs="+", default=["2:0", "2:0.1", "2:0.2", "2:0.3", "2:0.5", "1:0", "1.5:0", "2.5:0"],
                    help="TONE_BIAS:LAM cells")
    args = ap.parse_args()
    pairs = half_pairs(args.data, args.half, args.seed)
    gen = OfflineGenerator.load(None, "cpu", capacity=64)
    prior = log_unigram(args.train, gen.loaded.tokenizer.itos)
    lam = {"value": 0.0}
    base_table = Constrainer._table

    def table(self: Constrainer, tone_bias: float) -> torch.Tensor:  # the shipped table, shifted
        return base_table(self, tone_bias) - lam["value"] * prior

    Constrainer._table = table  # type: ignore[method-assign]
    uppers, refs = [u for u, _ in pairs], [lo for _, lo in pairs]
    out: list[dict[str, Any]] = []
    for cell in args.grid:
        tone_bias, lam["value"] = (float(x) for x in cell.split(":"))
        gen.runner.tone_bias = tone_bias
        t0 = time.perf_counter()
        results = gen.generate([CoupletRequest(upper=u) for u in uppers])
        hyps = ["" if isinstance(r, ChunlianError) else r.best.lower for r in results]
        m = compute_metrics(uppers, hyps, refs)
        row = {"half": args.half, "pairs": len(pairs), "tone_bias": tone_bias, "lam": lam["value"],
               "bleu4": round(m["bleu4"], 3), "bleu1": round(m["bleu1"], 2),
               "pingze_opposition": round(m["pingze_opposition"], 4),
               "rules_min": min(m["length_ok"], m["repeat_pattern_ok"], m["no_shared_char"]),
               "seconds": round(time.perf_counter() - t0, 1)}
        out.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
