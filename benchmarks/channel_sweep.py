"""Choose the channel-rerank weight (``engine.channel``): BLEU and rule rates against it.

    python benchmarks/channel_sweep.py --data runs/data/train.tsv --pairs 500 --beam 8 \\
        --weights 0 0.25 0.5 0.75 1 1.5 2 --out runs/channel_sweep_train.json

The beam's candidates and their channel scores are computed once; each weight then only
re-picks among them, so the sweep costs one beam search and one scoring pass. Choose the
weight on *training* pairs (``--data runs/data/train.tsv``, modern rows sampled with
``--seed``), or on one half of the validation split (``--data runs/data/val.tsv --half a``:
a seeded shuffle cut in two) and report the other half (``--half b``) at that weight, so
the reported half never chose anything.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from chunlian.data.corpus import read_pairs
from chunlian.engine.channel import ChannelScorer
from chunlian.engine.request import BeamHyp
from chunlian.errors import InvalidInput
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.offline import OfflineGenerator
from chunlian.text import validate_upper
from chunlian.training.evaluate import compute_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/data/train.tsv")
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--half", choices=["a", "b"], default=None,
                    help="only this half of the (seeded, shuffled) rows: choose on one, report the other")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--weights", type=float, nargs="+", default=[0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    ap.add_argument("--model", type=Path, default=None, help="weights (default: the shipped ones)")
    ap.add_argument("--channel-model", type=Path, action="append", default=[],
                    help="weights that score the channel term instead of the beam's own models (repeat to average)")
    ap.add_argument("--forward-model", type=Path, default=None,
                    help="also add F * log p(lower | upper) of these weights to each candidate's score")
    ap.add_argument("--forward-weights", type=float, nargs="+", default=[0.0])
    ap.add_argument("--rescore-top", type=int, nargs="+", default=[0],
                    help="rerank only the beam's best K lines (each K a row of the table; 0: all of them)")
    ap.add_argument("--nbest-cache", type=Path, default=None,
                    help="JSON of the beam's candidates: read if it exists, else written (skips the search)")
    ap.add_argument("--tone-bias", type=float, default=None, help="the 平仄 soft bias (default: the runner's)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    rows = [p for p in read_pairs(Path(args.data)) if p.register == "modern"]
    random.Random(args.seed).shuffle(rows)
    if args.half is not None:
        rows = rows[: len(rows) // 2] if args.half == "a" else rows[len(rows) // 2 :]
    pairs = []
    for p in rows:
        try:
            pairs.append((validate_upper(p.upper), p.lower))
        except InvalidInput:  # a row the service would refuse is skipped
            continue
        if len(pairs) == args.pairs:
            break
    gen = OfflineGenerator.load(args.model, "cpu", capacity=max(64, args.beam))
    if args.tone_bias is not None:
        gen.runner.tone_bias = args.tone_bias
    tone_bias = gen.runner.tone_bias
    items = [(u, "traditional") for u, _ in pairs]
    t0 = time.perf_counter()
    if args.nbest_cache is not None and args.nbest_cache.exists():
        cached = json.loads(args.nbest_cache.read_text(encoding="utf-8"))
        same = {"items": [list(it) for it in items], "beam": args.beam, "model": gen.loaded.tag,
                "tone_bias": tone_bias}
        if any(cached.get(k) != v for k, v in same.items()):
            raise SystemExit(f"{args.nbest_cache} holds another run's candidates (items, beam, models or tone bias differ)")
        nbest = [[BeamHyp(lo, lp, m) for lo, m, lp in hyps] for hyps in cached["nbest"]]
    else:
        nbest = [list(h) for h in gen.beam_nbest(items, args.beam)]
        if args.nbest_cache is not None:
            args.nbest_cache.write_text(json.dumps(
                {"items": items, "beam": args.beam, "model": gen.loaded.tag,
                 "tone_bias": tone_bias,
                 "nbest": [[[h.lower, h.logprob_mean, h.logprob] for h in hyps] for hyps in nbest]},
                ensure_ascii=False), encoding="utf-8")
    beam_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    scorers = tuple(load_weights(p, "cpu") for p in args.channel_model) or (gen.loaded,)
    channel = candidate_scores(scorers, items, nbest)
    channel_s = time.perf_counter() - t0
    uppers, refs = [u for u, _ in pairs], [lo for _, lo in pairs]
    table = []
    fwd: list[list[float]] | None = None
    if args.forward_model is not None:
        fwd = candidate_scores([load_weights(args.forward_model, "cpu")], items, nbest, forward=True)
    for top in args.rescore_top:
        cut = [hyps[:top] if top else hyps for hyps in nbest]
        for f in args.forward_weights if fwd is not None else [0.0]:
            for w in args.weights:
                # each candidate: logprob + w * channel (+ f * the second model's forward score)
                hyps = [h.lower for h in rerank(cut, (w, channel), *([(f, fwd)] if fwd is not None else []))]
                m = compute_metrics(uppers, hyps, refs)
                table.append({"weight": w, "forward_weight": f, "rescore_top": top, **m})
                print(json.dumps({"weight": w, "forward_weight": f, "rescore_top": top, "bleu4": m["bleu4"],
                                  "bleu1": m["bleu1"], "pingze_opposition": m["pingze_opposition"],
                                  "ends_ping": m["ends_ping"]}))
    report = {"data": args.data, "half": args.half, "seed": args.seed, "pairs": len(pairs), "beam": args.beam,
              "forward_model": str(args.forward_model) if args.forward_model else None,
              "model": gen.loaded.tag, "tone_bias": tone_bias,
              "channel_models": [m.tag for m in scorers],
              "channel_register": [ChannelScorer(m).register for m in scorers],
              "beam_s": round(beam_s, 1), "channel_s": round(channel_s, 1), "table": table}
    if args.out:
        args.out.write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


Scores = list[list[float]]  # one float per candidate of each request, shaped like nbest


def candidate_scores(models: tuple[LoadedModel, ...] | list[LoadedModel], items: list[tuple[str, str]],
                     nbest: list[list[BeamHyp]], forward: bool = False) -> Scores:
    """Each candidate's channel score (``forward``: its forward score), averaged over ``models``."""
    triples = [(upper, h.lower, style) for (upper, style), hyps in zip(items, nbest, strict=True) for h in hyps]
    per_model = [ChannelScorer(m, forward=forward).score(triples) for m in models]
    flat = iter([sum(col) / len(col) for col in zip(*per_model, strict=True)])
    return [[next(flat) for _ in hyps] for hyps in nbest]


def rerank(nbest: list[list[BeamHyp]], *terms: tuple[float, Scores]) -> list[BeamHyp]:
    """Each request's candidate with the best ``logprob + sum(weight * score)`` (ties: the
    beam's order), as ``engine.rescore.Rescorer`` ranks them."""
    def total(r: int, k: int, h: BeamHyp) -> float:
        return h.logprob + sum(w * sc[r][k] for w, sc in terms)

    return [max(enumerate(hyps), key=lambda kh: total(r, kh[0], kh[1]))[1] for r, hyps in enumerate(nbest)]


if __name__ == "__main__":
    main()
