"""Sequence-level knowledge distillation (Kim and Rush, 2016): the offline quality mode's
下联 for a seeded sample of modern *training* upper lines, written as a data directory that
``chunlian train`` reads, so that the greedy model the service runs can learn the slow
search's answers::

    chunlian distill --data runs/data --out runs/distill --limit 15000
    chunlian train --data runs/distill --init-from src/chunlian/weights/chunlian-couplet.safetensors ...

Only training pairs are distilled and the validation split is copied unchanged: a validation
line never reaches the teacher's input or the student's targets. The teacher's answers are
appended to ``distilled.jsonl`` as they come (one object a line: ``upper``, ``gold``,
``lower``), so a stopped run resumes where it stopped; the data directory is rewritten from
that file at the end of every run.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from chunlian.data.corpus import Pair, read_pairs, write_pairs
from chunlian.types import CoupletRequest

DISTILLED = "distilled.jsonl"
DEFAULT_SEED = 20261202
# the teacher answers under the default style of a request (CoupletRequest's), as
# `chunlian eval` and a request without a style are answered
TEACHER_STYLE = CoupletRequest().style


class _Lines(Protocol):
    @property
    def lower(self) -> str: ...


class _Result(Protocol):
    @property
    def best(self) -> _Lines: ...


class Teacher(Protocol):
    """What distillation needs of a generator (``OfflineGenerator`` in quality mode)."""

    def generate(self, requests: list[CoupletRequest]) -> Sequence[_Result | Exception]: ...


def sample_uppers(pairs: list[Pair], limit: int, seed: int = DEFAULT_SEED) -> list[Pair]:
    """A seeded sample of ``limit`` modern pairs (the register the service answers in), the
    first pair of each distinct upper line in a seeded shuffle: the same seed gives the same
    sample, and a larger limit extends a smaller one."""
    modern = [p for p in pairs if p.register == "modern"]
    random.Random(seed).shuffle(modern)
    seen: set[str] = set()
    out = []
    for p in modern:
        if p.upper not in seen:
            seen.add(p.upper)
            out.append(p)
            if len(out) == limit:
                break
    return out


def read_distilled(path: Path) -> dict[str, str]:
    """upper -> the teacher's lower, from a (possibly interrupted) ``distilled.jsonl``; a
    last line cut short by a stop is ignored."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[row["upper"]] = row["lower"]
    return out


def run_teacher(
    teacher: Teacher, todo: list[Pair], path: Path, chunk: int = 64,
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """Answer ``todo`` in chunks, appending each answer to ``path`` as soon as its chunk is
    done; lines the teacher refuses are skipped. Returns the number written."""
    written = 0
    with path.open("a", encoding="utf-8") as f:
        for i in range(0, len(todo), chunk):
            part = todo[i : i + chunk]
            results = teacher.generate([CoupletRequest(upper=p.upper, style=TEACHER_STYLE) for p in part])
            for p, res in zip(part, results, strict=True):
                if isinstance(res, Exception):
                    continue
                f.write(json.dumps({"upper": p.upper, "gold": p.lower, "lower": res.best.lower},
                                   ensure_ascii=False) + "\n")
                written += 1
            f.flush()
            if on_chunk is not None:
                on_chunk(len(part))
    return written


def build_data_dir(data_dir: Path, out_dir: Path, distilled: dict[str, str], copies: int = 1) -> dict[str, int]:
    """Write ``out_dir/{train,val}.tsv``: the training pairs with each distilled modern
    pair's 下联 replaced by the teacher's (and ``copies - 1`` more copies of those pairs, to
    weigh the teacher's answers up against the gold ones left), the validation split copied
    as it is. Refuses a distilled line that is a validation upper line or whose length
    differs from its upper's."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    if out_dir.resolve() == data_dir.resolve():
        raise ValueError(f"the output directory {out_dir} is the data directory: its training split would be overwritten")
    val_uppers = {p.upper for p in read_pairs(data_dir / "val.tsv")}
    leaked = sorted(u for u in distilled if u in val_uppers)
    if leaked:
        raise ValueError(f"{len(leaked)} distilled upper lines are validation lines (first: {leaked[0]})")
    bad = sorted(u for u, lo in distilled.items() if len(lo) != len(u))
    if bad:
        raise ValueError(f"{len(bad)} distilled lines differ in length from their upper line (first: {bad[0]})")
    pairs = read_pairs(data_dir / "train.tsv")
    replaced = 0
    out: list[Pair] = []
    for p in pairs:
        lower = distilled.get(p.upper) if p.register == "modern" else None
        if lower is not None:
            out.append(replace(p, lower=lower))
            replaced += 1
        else:
            out.append(p)
    extra = [q for p, q in zip(pairs, out, strict=True) if p is not q] * (copies - 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(out_dir / "train.tsv", out + extra)
    shutil.copyfile(data_dir / "val.tsv", out_dir / "val.tsv")
    stats = {"train_pairs": len(out) + len(extra), "distilled_uppers": len(distilled), "replaced_pairs": replaced,
             "changed_pairs": sum(a.lower != b.lower for a, b in zip(pairs, out, strict=True)), "copies": copies}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return stats
