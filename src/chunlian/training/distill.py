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
* A row is ``key`` (``upper_key``: a hash of the 上联, not its text), the sampled pair's
  ``register``, the teacher's ``best`` line, and of its ``NBEST`` reranked lines the one
  ``nearest`` the gold 下联. It holds model output only, so a set can live with the code
  (``data/distilled``) and grow across runs on other machines; the trainer finds each row's
  上联 again in ``train.tsv``.
* Each finished chunk is appended to ``distilled-<k>of<n>.tsv`` and flushed, and the shard's
  manifest (``distilled-<k>of<n>.json``: preset, weights, seed, counts, lines/s) rewritten: a
  killed run loses one chunk at most, and the same command resumes with the 上联s no shard's
  file holds yet (under any ``--shard`` split). A set is one teacher's: a run whose preset,
  weights, seed or sources differ from the manifest's is refused.

``chunlian train --distilled runs/distill`` adds the rows as the source ``distilled``
(``--mix distilled=0.5,...``); ``--distilled-target nearest`` teaches each row's nearest line
instead of the best (Kim & Rush's sequence-level interpolation).
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chunlian.data.corpus import Pair, read_pairs, read_rows

DISTILLED = "distilled"  # the source name of distilled rows
NBEST = 8  # the reranked search's best lines a row is chosen from (they cost no search time)
FIELDS = ("key", "register", "best", "nearest")
TARGETS = ("best", "nearest")
# a manifest's fields that name the teacher and the sample: a set holds one of each
SAME_TEACHER = ("preset", "search_weights", "rescore_weights", "seed", "sources")


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


def upper_key(upper: str) -> str:
    """A distilled row's 上联 as 16 hex digits (BLAKE2b, 8 bytes): the row names its training
    line without holding the corpus text, so a set can be kept with the code."""
    return hashlib.blake2b(upper.encode("utf-8"), digest_size=8).hexdigest()


def training_uppers(data_dir: Path, sources: tuple[str, ...] = ()) -> list[Pair]:
    """The training pairs (of ``sources``, or of every source) with distinct 上联s, the first
    pair of each, none of which opens a validation pair, in file order."""
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
    return pool


def sample_uppers(data_dir: Path, count: int, seed: int, sources: tuple[str, ...] = ()) -> list[Pair]:
    """``count`` of ``training_uppers`` in a seeded random order."""
    pool = training_uppers(data_dir, sources)
    random.Random(seed).shuffle(pool)
    return pool[:count]


def set_files(path: Path) -> list[Path]:
    """A set's shard files: ``path`` itself, or every shard's file in the folder ``path``."""
    return sorted(path.glob(f"{DISTILLED}-*.tsv")) if path.is_dir() else [path]


def written_keys(out_dir: Path) -> set[str]:
    """The 上联s already answered by any shard in the folder ``out_dir``, as keys."""
    return {r["key"] for f in set_files(out_dir) for r in read_rows(f)}


def _drop_partial_row(tsv: Path) -> None:
    """Cut a row a killed run left half written (the file then ends inside it)."""
    if tsv.exists() and (data := tsv.read_bytes()) and not data.endswith(b"\n"):
        tsv.write_bytes(data[:data.rfind(b"\n") + 1])


def _check_same_teacher(out_dir: Path, made: dict[str, Any]) -> None:
    """Refuse to add to a set that any shard began with another teacher or sample: one set,
    one teacher."""
    for meta in sorted(out_dir.glob(f"{DISTILLED}-*.json")):
        manifest = json.loads(meta.read_text(encoding="utf-8"))
        for field in SAME_TEACHER:
            if field in manifest and manifest[field] != made[field]:
                raise ValueError(f"{meta} was written with {field} {manifest[field]!r}, this run has"
                                 f" {made[field]!r}: give another --out-dir")


def chunks(items: list[Pair], size: int) -> Iterator[list[Pair]]:
    for k in range(0, len(items), size):
        yield items[k:k + size]


# 64 rows (two width-32 searches at a time) is the fastest pool on one core: 6.5 lines/s against
# 4.9 with 256 rows (AMD EPYC, 1 thread, 64 wb14123 lines), as the KV copy after each beam
# step grows with the pool
def distill(data_dir: Path, out_dir: Path, count: int, shard: Shard, seed: int = 0, chunk: int = 64,
            sources: tuple[str, ...] = (), device: str = "cpu", capacity: int = 64,
            progress: bool = True, minutes: float | None = None) -> dict[str, Any]:
    """Write (or go on writing) one shard of the set, stopping after the chunk that ends past
    ``minutes`` (None: when the shard is done); returns its manifest."""
    from tqdm import tqdm

    from chunlian.data.blocklist import default_blocklist
    from chunlian.engine.tiers import BEST
    from chunlian.offline import OfflineGenerator
    from chunlian.types import CoupletRequest, DecodeParams

    if count < 1 or chunk < 1:
        raise ValueError(f"--count and --chunk must be at least 1, got {count} and {chunk}")
    if capacity < BEST.width:
        raise ValueError(f"--beam-rows must hold one search of width {BEST.width}, got {capacity}")
    if minutes is not None and minutes <= 0:
        raise ValueError(f"--minutes must be above 0, got {minutes}")
    stop_at = time.monotonic() + minutes * 60 if minutes is not None else float("inf")
    mine = sample_uppers(data_dir, count, seed, sources)[shard.index::shard.count]
    out_dir.mkdir(parents=True, exist_ok=True)
    tsv, meta = out_dir / f"{shard.name}.tsv", out_dir / f"{shard.name}.json"
    _drop_partial_row(tsv)
    # the sample's 上联s are distinct, so what is left is what no file holds yet (a line that
    # failed in an earlier run is tried again)
    done = written_keys(out_dir)
    todo = [p for p in mine if upper_key(p.upper) not in done]
    manifest: dict[str, Any] = json.loads(meta.read_text()) if meta.exists() else {"failed": 0, "seconds": 0.0}
    gen = OfflineGenerator.load_quality(device, capacity, default_blocklist())
    made = {"preset": asdict(BEST), "search_weights": gen.loaded.tag,
            "rescore_weights": [m.tag for m in gen.rescorers], "seed": seed, "sources": list(sources) or "all"}
    _check_same_teacher(out_dir, made)
    manifest.update(made)
    manifest.update({
        "what": "the quality mode's best 下联, and its n-best line nearest the gold one, for training 上联s"
                " (sequence-level distillation)",
        "data": str(data_dir), "count": count, "shard": f"{shard.index}/{shard.count}", "shard_items": len(mine),
        "rows": len(read_rows(tsv)) if tsv.exists() else 0, "nbest": NBEST, "columns": list(FIELDS),
    })
    params = DecodeParams(n=NBEST, beam=gen.beam_params())
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="line", disable=not progress)
    header = not tsv.exists()
    with tsv.open("a", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        if header:
            w.writerow(FIELDS)
        for part in chunks(todo, chunk):
            t0 = time.perf_counter()
            outs = gen.run([CoupletRequest(upper=p.upper, params=params) for p in part])
            for p, o in zip(part, outs, strict=True):
                r = o.result
                if r is None:  # the request's error ends only that line
                    manifest["failed"] += 1
                else:
                    lines = [c.lower for c in (r.candidates or (r.best,))]
                    w.writerow((upper_key(p.upper), p.register, r.best.lower, nearest(p.lower, lines)))
                    manifest["rows"] += 1
            f.flush()
            manifest["seconds"] = round(manifest["seconds"] + time.perf_counter() - t0, 2)
            manifest["lines_per_s"] = round((manifest["rows"] + manifest["failed"]) / max(manifest["seconds"], 1e-9), 3)
            meta.write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n")
            bar.update(len(part))
            if time.monotonic() >= stop_at:
                break
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


def read_distilled(path: Path, data_dir: Path, target: str = "best") -> tuple[list[Pair], int]:
    """The rows of a distillation set (one shard's file, or every shard in a folder) as pairs,
    each row's ``best`` or ``nearest`` line answering its 上联, found again by key among the
    training 上联s of ``data_dir`` (so a validation 上联 is never one of them); and how many
    rows are left out: those naming no training 上联 there (a set made from another
    preparation of the corpora) and a row a killed run left half written (its line is not of
    its 上联's length)."""
    if target not in TARGETS:
        raise ValueError(f"the distilled target is one of {', '.join(TARGETS)}, got {target!r}")
    files = set_files(path)
    if not files or not all(f.is_file() for f in files):
        raise ValueError(f"no distillation set at {path} (chunlian distill writes one)")
    uppers = {upper_key(p.upper): p for p in training_uppers(data_dir)}
    pairs: dict[str, Pair] = {}
    left_out = 0
    for f in files:
        rows = read_rows(f)
        if rows and not set(FIELDS) <= rows[0].keys():
            raise ValueError(f"{f} is not a distillation set: its columns are not {', '.join(FIELDS)}")
        for r in rows:
            p = uppers.get(r["key"])
            line = r[target] or ""  # None: the row ends before this column
            if p is None or len(line) != len(p.upper):
                left_out += 1
            else:  # a key twice (two runs over one line) is one pair
                pairs[r["key"]] = Pair(p.upper, line, r["register"], DISTILLED)
    if not pairs:
        raise ValueError(f"no row of the distillation set at {path} names a training 上联 of {data_dir}")
    return list(pairs.values()), left_out
