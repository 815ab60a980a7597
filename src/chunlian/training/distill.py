"""A distillation set: the quality mode's best 下联 for a sample of training 上联s
(sequence-level knowledge distillation, Kim & Rush 2016: a student trained on its teacher's
beam outputs).

``chunlian distill --data runs/data --out-dir runs/distill --count 200000 --shard 0/2``

* The sample is drawn from ``train.tsv`` with a fixed seed: every shard and every resumed run
  sees the same order, and shard ``k`` of ``n`` takes every ``n``-th 上联 from the ``k``-th.
  An 上联 that also opens a validation pair is never taken.
* The teacher is ``OfflineGenerator.load_quality``: the engine's best mode (``QUALITY``:
  the reverse-trained weights' beam reranked by channel and forward scores). Requests are
  plain ones (the default style, no zodiac rule), as ``chunlian eval`` asks them.
* Each finished chunk is appended to ``distilled-<k>of<n>.tsv`` (the columns of
  ``train.tsv`` with the teacher's best line as ``lower`` and ``source`` = ``distilled``, then
  the gold 下联 and the search's ``NBEST`` reranked lines) and flushed, and the shard's manifest
  (``distilled-<k>of<n>.json``: preset, weights, seed, counts, lines/s) rewritten: a
  killed run loses one chunk at most, and the same command resumes with the lines the file
  does not hold yet.

``chunlian train --distilled runs/distill`` adds the rows as the source ``distilled``
(``--mix distilled=0.5,...``); ``--distilled-target nearest`` teaches each row's n-best line
nearest its gold one instead of the best (Kim & Rush's sequence-level interpolation).
"""

from __future__ import annotations

import csv
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from chunlian.data.corpus import Pair, pair_of, read_pairs, read_rows

DISTILLED = "distilled"  # the source name of distilled rows
NBEST = 8  # the reranked search's best lines kept a row (asking for them costs no search time)
# train.tsv's columns (``lower``: the teacher's best line), then the gold 下联 and the n-best
FIELDS = ("upper", "lower", "register", "source", "gold", "nbest")
NBEST_SEP = "|"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``k/n`` -> Shard(k, n); ValueError naming the form."""
        k, sep, n = text.partition("/")
        try:
            shard = cls(int(k), int(n))
        except ValueError:
            raise ValueError(f"--shard wants k/n with 0 <= k < n, got {text!r}") from None
        if not sep or not 0 <= shard.index < shard.count:
            raise ValueError(f"--shard wants k/n with 0 <= k < n, got {text!r}")
        return shard

    @property
    def name(self) -> str:
        return f"{DISTILLED}-{self.index}of{self.count}"


def sample_uppers(data_dir: Path, count: int, seed: int, sources: tuple[str, ...] = ()) -> list[Pair]:
    """``count`` training pairs (of ``sources``, or of every source) with distinct 上联s, none
    of which opens a validation pair, in a seeded random order (the gold 下联 is not used)."""
    val = {p.upper for path in sorted(data_dir.glob("val*.tsv")) for p in read_pairs(path)}
    if not val:
        raise ValueError(f"no validation split in {data_dir}: run 'chunlian data' first")
    seen: set[str] = set()
    pool: list[Pair] = []
    for p in read_pairs(data_dir / "train.tsv"):
        if p.upper not in seen and p.upper not in val and (not sources or p.source in sources):
            seen.add(p.upper)
            pool.append(p)
    if not pool:
        raise ValueError(f"train.tsv in {data_dir} holds no pairs of {', '.join(sources)}")
    random.Random(seed).shuffle(pool)
    return pool[:count]


def written_uppers(path: Path) -> set[str]:
    """The 上联s already answered in ``path`` (none when it does not exist)."""
    return {p.upper for p in read_pairs(path)} if path.exists() else set()


def chunks(items: list[Pair], size: int) -> Iterator[list[Pair]]:
    for k in range(0, len(items), size):
        yield items[k:k + size]


# 64 rows (two width-32 searches at a time) is the fastest pool on one core: 6.5 lines/s against
# 4.9 with 256 rows (AMD EPYC, 1 thread, 64 wb14123 lines), as the KV copy after each beam
# step grows with the pool
def distill(data_dir: Path, out_dir: Path, count: int, shard: Shard, seed: int = 0, chunk: int = 64,
            sources: tuple[str, ...] = (), device: str = "cpu", capacity: int = 64,
            progress: bool = True) -> dict[str, Any]:
    """Write (or go on writing) one shard of the set; returns its manifest."""
    from tqdm import tqdm

    from chunlian.data.blocklist import default_blocklist
    from chunlian.engine.tiers import BEST
    from chunlian.offline import OfflineGenerator
    from chunlian.types import CoupletRequest, DecodeParams

    if count < 1 or chunk < 1:
        raise ValueError(f"--count and --chunk must be at least 1, got {count} and {chunk}")
    mine = sample_uppers(data_dir, count, seed, sources)[shard.index::shard.count]
    out_dir.mkdir(parents=True, exist_ok=True)
    tsv, meta = out_dir / f"{shard.name}.tsv", out_dir / f"{shard.name}.json"
    done = written_uppers(tsv)
    # the sample's 上联s are distinct, so what is left is what the file does not hold yet (a
    # line that failed in an earlier run is tried again)
    todo = [p for p in mine if p.upper not in done]
    manifest: dict[str, Any] = json.loads(meta.read_text()) if meta.exists() else {"failed": 0, "seconds": 0.0}
    gen = OfflineGenerator.load_quality(device, capacity, default_blocklist())
    manifest.update({
        "what": "the quality mode's best 下联 for training 上联s (sequence-level distillation)",
        "preset": asdict(BEST), "search_weights": gen.loaded.tag,
        "rescore_weights": [m.tag for m in gen.rescorers], "data": str(data_dir), "sources": list(sources) or "all",
        "seed": seed, "count": count, "shard": f"{shard.index}/{shard.count}", "shard_items": len(mine),
        "rows": len(done), "nbest": NBEST, "columns": list(FIELDS),
    })
    params = DecodeParams(n=NBEST, beam=gen.beam_params())
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="line", disable=not progress)
    with tsv.open("a", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        if not done:
            w.writerow(FIELDS)
        for part in chunks(todo, chunk):
            t0 = time.perf_counter()
            outs = gen.run([CoupletRequest(upper=p.upper, params=params) for p in part])
            for p, o in zip(part, outs, strict=True):
                r = o.result
                if r is None:  # the request's error ends only that line
                    manifest["failed"] += 1
                else:
                    nbest = NBEST_SEP.join(c.lower for c in (r.candidates or (r.best,)))
                    w.writerow((p.upper, r.best.lower, p.register, DISTILLED, p.lower, nbest))
                    manifest["rows"] += 1
            f.flush()
            manifest["seconds"] = round(manifest["seconds"] + time.perf_counter() - t0, 2)
            manifest["lines_per_s"] = round((manifest["rows"] + manifest["failed"]) / max(manifest["seconds"], 1e-9), 3)
            meta.write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n")
            bar.update(len(part))
    bar.close()
    return manifest


def overlap(a: str, b: str) -> int:
    """Shared characters plus shared character bigrams (clipped counts): how close a line is
    to another, as BLEU-2 counts it."""
    def grams(s: str, n: int) -> Counter[str]:
        return Counter(s[k:k + n] for k in range(len(s) - n + 1))
    return sum(sum((grams(a, n) & grams(b, n)).values()) for n in (1, 2))


def nearest(gold: str, nbest: list[str]) -> str:
    """The n-best line closest to the gold one, the higher-ranked on a tie (Kim & Rush's
    sequence-level interpolation: a teacher's line that keeps what the reference says)."""
    return max(enumerate(nbest), key=lambda kv: (overlap(kv[1], gold), -kv[0]))[1]


TOP_K = 4  # the ``top4`` target's lines a row
TARGETS = ("best", "nearest", f"top{TOP_K}")


def read_distilled(path: Path, target: str = "best") -> list[Pair]:
    """The rows of a distillation set (one shard's file, or every shard in a folder) as pairs:
    each row's best line (``best``), its n-best line nearest the gold one (``nearest``), or
    each of its ``TOP_K`` best lines as a pair of its own (``top4``: more of the teacher's
    distribution for no more teacher time). The last two need the ``gold`` and ``nbest``
    columns."""
    if target not in TARGETS:
        raise ValueError(f"the distilled target is one of {', '.join(TARGETS)}, got {target!r}")
    files = sorted(path.glob(f"{DISTILLED}-*.tsv")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(f"no distillation set at {path} (chunlian distill writes one)")
    pairs: list[Pair] = []
    for f in files:
        for r in read_rows(f):
            pair = replace(pair_of(r), source=DISTILLED)
            if target == "best":
                pairs.append(pair)
                continue
            if not r.get("gold") or not r.get("nbest"):
                raise ValueError(f"{f} holds no gold and n-best columns: only --distilled-target best reads it")
            nbest = r["nbest"].split(NBEST_SEP)
            lines = [nearest(r["gold"], nbest)] if target == "nearest" else nbest[:TOP_K]
            pairs += [replace(pair, lower=line) for line in lines]
    return pairs
