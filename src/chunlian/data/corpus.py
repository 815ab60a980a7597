"""Read, clean, de-duplicate and split the couplet corpora.

Input: ``DATA_DIR/couplets/{modern,classical_lvshi}.tsv`` and ``DATA_DIR/safety/blocklist.txt``
(see the data folder's README). Output: ``train.tsv`` and ``val.tsv`` with columns
``upper, lower, register``, plus ``stats.json`` with the counts kept and dropped per reason.

The validation split is carved from the modern set with a fixed seed, grouped by the Han
characters of the 上联 so that a punctuated and an unpunctuated copy of one couplet never
straddle the split; any training pair that shares an upper or lower line with a validation
pair is dropped as a leak.
"""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from chunlian.data.blocklist import Blocklist
from chunlian.text import CLAUSE_PUNCT, MAX_LINE_CHARS, is_han, normalize, punct_positions

REGISTERS = ("modern", "classical")


@dataclass(frozen=True)
class Pair:
    upper: str
    lower: str
    register: str  # "modern" | "classical" (training also makes "reversed" pairs)


@dataclass
class CleanStats:
    read: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)  # "reason" -> count

    def as_dict(self) -> dict[str, object]:
        return {"read": dict(self.read), "kept": dict(self.kept), "dropped": dict(self.dropped)}


def drop_reason(upper: str, lower: str, blocklist: Blocklist | None) -> str | None:
    """Why a normalised pair must be dropped, or None to keep it."""
    if not upper or not lower:
        return "empty"
    if len(upper) != len(lower):
        return "length_mismatch"
    for line in (upper, lower):
        if any(not is_han(c) and c not in CLAUSE_PUNCT for c in line):
            return "non_chinese"
        if not is_han(line[0]) or not is_han(line[-1]):
            return "non_chinese"
    if punct_positions(upper) != punct_positions(lower):
        return "punct_mismatch"
    if len(upper) > MAX_LINE_CHARS:
        return "too_long"
    if upper == lower:
        return "identical_lines"
    if blocklist is not None and (blocklist.find(upper) or blocklist.find(lower)):
        return "blocklisted"
    return None


def read_tsv(path: Path) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row.get("upper") or "", row.get("lower") or "") for row in reader]


def clean(
    rows: list[tuple[str, str]], register: str, blocklist: Blocklist | None, stats: CleanStats,
    seen: set[tuple[str, str]],
) -> list[Pair]:
    out: list[Pair] = []
    for raw_u, raw_l in rows:
        stats.read[register] += 1
        u, lo = normalize(raw_u), normalize(raw_l)
        reason = drop_reason(u, lo, blocklist)
        if reason is None and (u, lo) in seen:
            reason = "duplicate"
        if reason is not None:
            stats.dropped[f"{register}:{reason}"] += 1
            continue
        seen.add((u, lo))
        out.append(Pair(u, lo, register))
    return out


def _han_key(line: str) -> str:
    return "".join(c for c in line if is_han(c))


def split(
    modern: list[Pair], classical: list[Pair], val_size: int, seed: int, stats: CleanStats
) -> tuple[list[Pair], list[Pair]]:
    """Carve ``val_size`` modern pairs (grouped by upper line) into validation."""
    groups: dict[str, list[Pair]] = {}
    for p in modern:
        groups.setdefault(_han_key(p.upper), []).append(p)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    val: list[Pair] = []
    for k in keys:
        if len(val) >= val_size:
            break
        val.append(groups[k][0])  # one reference per upper line
    val_lines = {_han_key(p.upper) for p in val} | {_han_key(p.lower) for p in val}
    train: list[Pair] = []
    for p in modern + classical:
        if _han_key(p.upper) in val_lines or _han_key(p.lower) in val_lines:
            stats.dropped[f"{p.register}:overlaps_validation"] += 1
            continue
        train.append(p)
    return train, val


def write_pairs(path: Path, pairs: list[Pair]) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write("upper\tlower\tregister\n")
        for p in pairs:
            f.write(f"{p.upper}\t{p.lower}\t{p.register}\n")


def read_pairs(path: Path) -> list[Pair]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [Pair(r["upper"], r["lower"], r.get("register") or "modern") for r in reader]


def prepare(data_dir: Path, out_dir: Path, val_size: int = 2000, seed: int = 20260217) -> CleanStats:
    """Run the whole pipeline; write train/val TSVs and stats.json into ``out_dir``."""
    couplets = data_dir / "couplets"
    if not (couplets / "modern.tsv").is_file():
        raise FileNotFoundError(f"expected {couplets / 'modern.tsv'}; is --data-dir right?")
    blocklist = Blocklist.from_file(data_dir / "safety" / "blocklist.txt")
    stats = CleanStats()
    seen: set[tuple[str, str]] = set()
    modern = clean(read_tsv(couplets / "modern.tsv"), "modern", blocklist, stats, seen)
    classical_path = couplets / "classical_lvshi.tsv"
    classical = (
        clean(read_tsv(classical_path), "classical", blocklist, stats, seen)
        if classical_path.is_file()
        else []
    )
    train, val = split(modern, classical, val_size, seed, stats)
    for p in train:
        stats.kept[f"train:{p.register}"] += 1
    stats.kept["val:modern"] = len(val)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(out_dir / "train.tsv", train)
    write_pairs(out_dir / "val.tsv", val)
    (out_dir / "stats.json").write_text(
        json.dumps(stats.as_dict(), ensure_ascii=False, indent=2), encoding="utf-8"
    )
    return stats
