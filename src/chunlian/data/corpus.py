"""Read, clean, de-duplicate and split the couplet corpora.

Input: every file of ``SOURCES`` found under ``DATA_DIR/couplets/`` (see the data folder's
README); pairs holding a term of the safety list's training filter are dropped
(``data.blocklist.training_blocklist``). Output: ``train.tsv`` and one file per ``VAL_SPLITS``
entry, with columns ``upper, lower, register, source``, plus ``stats.json`` with the counts
read, kept and dropped per source and reason.

De-duplication is across sources, on the Han characters of both lines (a punctuated and an
unpunctuated copy of one couplet are one pair); the first source in ``SOURCES`` order keeps it.
Each validation split is carved from one source with a fixed seed, grouped by the Han characters
of the 上联, one reference per upper line; any training pair that shares an upper or lower line
with a pair of *any* validation split is dropped as a leak. The shipped splits are pinned
(``resources/val_splits.txt``: a hash of each pair's Han characters, in order), so they stay
the same files whatever the filters let through: a carve shuffles the source's cleaned pairs,
and a change to the safety list changes which pairs those are.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from chunlian.data.blocklist import Blocklist, training_blocklist
from chunlian.text import CLAUSE_PUNCT, MAX_LINE_CHARS, is_han, normalize, punct_positions

REGISTERS = ("modern", "classical")


@dataclass(frozen=True)
class Source:
    name: str
    file: str  # under DATA_DIR/couplets/
    register: str  # the register token the model is trained with
    min_han_chars: int = 1  # shorter lines are dropped ("too_short"): junk pairs in scraped sets
    required: bool = False


SOURCES: tuple[Source, ...] = (
    Source("modern", "modern.tsv", "modern", required=True),
    Source("classical", "classical_lvshi.tsv", "classical"),
    Source("more_modern", "more_modern.tsv", "modern", min_han_chars=4),
    Source("wb14123", "wb14123_train.tsv", "modern", min_han_chars=4),
)


@dataclass(frozen=True)
class ValSplit:
    file: str  # written to the output folder
    source: str  # a Source.name
    seed: int


# The seeds are part of the splits' identity: changing one moves pairs between train and val.
VAL_SPLITS: tuple[ValSplit, ...] = (
    ValSplit("val.tsv", "modern", 20260217),
    ValSplit("val_wb14123.tsv", "wb14123", 20261203),
)


@dataclass(frozen=True)
class Pair:
    upper: str
    lower: str
    register: str  # "modern" | "classical" (training also makes "reversed" pairs)
    source: str = "modern"  # a Source.name ("reversed" for pairs training turns round)


@dataclass
class CleanStats:
    read: Counter[str] = field(default_factory=Counter)  # source -> rows
    kept: Counter[str] = field(default_factory=Counter)  # "train:source" / "val file" -> pairs
    dropped: Counter[str] = field(default_factory=Counter)  # "source:reason" -> rows

    def as_dict(self) -> dict[str, object]:
        return {"read": dict(self.read), "kept": dict(self.kept), "dropped": dict(self.dropped)}

    def table(self) -> str:
        """Counts per source: read, trained on, held out, and dropped per reason."""
        reasons = sorted({k.split(":", 1)[1] for k in self.dropped})
        head = ["source", "read", "train", "val", *reasons]
        rows = [head]
        for name in self.read:
            val = sum(v for k, v in self.kept.items() if k.startswith(f"val:{name}:"))
            rows.append([name, str(self.read[name]), str(self.kept[f"train:{name}"]), str(val),
                         *(str(self.dropped[f"{name}:{r}"]) for r in reasons)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                                   enumerate(zip(r, widths, strict=True))) for r in rows)


def drop_reason(upper: str, lower: str, blocklist: Blocklist | None, min_han_chars: int = 1) -> str | None:
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
    if sum(1 for c in upper if is_han(c)) < min_han_chars:
        return "too_short"
    if upper == lower:
        return "identical_lines"
    if blocklist is not None and (blocklist.find(upper) or blocklist.find(lower)):
        return "blocklisted"
    return None


def read_tsv(path: Path) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row.get("upper") or "", row.get("lower") or "") for row in reader]


def _han_key(line: str) -> str:
    return "".join(c for c in line if is_han(c))


def clean(
    rows: list[tuple[str, str]], source: Source, blocklist: Blocklist | None, stats: CleanStats,
    seen: set[tuple[str, str]],
) -> list[Pair]:
    """Normalise and filter one source's rows; ``seen`` holds the Han keys kept so far."""
    out: list[Pair] = []
    for raw_u, raw_l in rows:
        stats.read[source.name] += 1
        u, lo = normalize(raw_u), normalize(raw_l)
        reason = drop_reason(u, lo, blocklist, source.min_han_chars)
        key = (_han_key(u), _han_key(lo))
        if reason is None and key in seen:
            reason = "duplicate"
        if reason is not None:
            stats.dropped[f"{source.name}:{reason}"] += 1
            continue
        seen.add(key)
        out.append(Pair(u, lo, source.register, source.name))
    return out


def carve(pairs: list[Pair], val_size: int, seed: int) -> list[Pair]:
    """``val_size`` pairs, one per distinct upper line, in a seeded order."""
    groups: dict[str, list[Pair]] = {}
    for p in pairs:
        groups.setdefault(_han_key(p.upper), []).append(p)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    return [groups[k][0] for k in keys[:val_size]]


PINNED_SIZE = 2000  # the pinned splits' size: another --val-size carves new splits
_PINS = Path(__file__).resolve().parent.parent / "resources" / "val_splits.txt"


def pair_hash(p: Pair) -> str:
    """A pinned pair's identity: a hash of the Han characters of both lines."""
    key = f"{_han_key(p.upper)}\t{_han_key(p.lower)}".encode()
    return hashlib.blake2b(key, digest_size=6).hexdigest()


def read_pins(path: Path = _PINS) -> dict[str, list[str]]:
    """{split file: pair hashes in order} from a pins file (``# file`` starts a split)."""
    pins: dict[str, list[str]] = {}
    current: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            current = pins.setdefault(line[2:].strip(), [])
        elif line:
            current.append(line)
    return pins


def pinned(pairs: list[Pair], hashes: list[str], file: str) -> list[Pair]:
    """The pairs of ``hashes``, in their order; every one must be among ``pairs``."""
    by_hash = {pair_hash(p): p for p in reversed(pairs)}  # the first pair wins, as in ``carve``
    missing = [i for i, h in enumerate(hashes) if h not in by_hash]
    if missing:
        raise ValueError(f"{file}: {len(missing)} pinned validation pairs are not among the cleaned pairs "
                         f"(the first at row {missing[0] + 1}); the corpora differ from the ones the split "
                         "was pinned on: give another --val-size to carve new splits")
    return [by_hash[h] for h in hashes]


def split(
    by_source: dict[str, list[Pair]], stats: CleanStats, val_size: int,
    splits: tuple[ValSplit, ...] = VAL_SPLITS, pins: dict[str, list[str]] | None = None,
) -> tuple[list[Pair], dict[str, list[Pair]]]:
    """(training pairs, {split file: validation pairs}); leaks into any split are dropped.
    A split named in ``pins`` is those pairs; the others are carved."""
    pins = pins or {}
    vals = {s.file: pinned(by_source.get(s.source, []), pins[s.file], s.file) if s.file in pins
            else carve(by_source.get(s.source, []), val_size, s.seed) for s in splits}
    val_lines = {_han_key(line) for val in vals.values() for p in val for line in (p.upper, p.lower)}
    train: list[Pair] = []
    for pairs in by_source.values():
        for p in pairs:
            if _han_key(p.upper) in val_lines or _han_key(p.lower) in val_lines:
                stats.dropped[f"{p.source}:overlaps_validation"] += 1
                continue
            train.append(p)
    return train, vals


def write_pairs(path: Path, pairs: list[Pair]) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write("upper\tlower\tregister\tsource\n")
        for p in pairs:
            f.write(f"{p.upper}\t{p.lower}\t{p.register}\t{p.source}\n")


def read_rows(path: Path) -> list[dict[str, str]]:
    """A pairs TSV's rows by column name (files such as a distillation set add columns)."""
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def pair_of(row: dict[str, str]) -> Pair:
    register = row.get("register") or "modern"
    return Pair(row["upper"], row["lower"], register, row.get("source") or register)


def read_pairs(path: Path) -> list[Pair]:
    return [pair_of(r) for r in read_rows(path)]


def prepare(data_dir: Path, out_dir: Path, val_size: int = PINNED_SIZE,
            blocklist: Blocklist | None = None) -> CleanStats:
    """Run the whole pipeline; write the train and validation TSVs and stats.json.
    ``blocklist``: the training filter (default: the shipped list's); the validation splits
    are the pinned ones at ``PINNED_SIZE``, carved ones at any other ``val_size``."""
    couplets = data_dir / "couplets"
    for src in SOURCES:
        if src.required and not (couplets / src.file).is_file():
            raise FileNotFoundError(f"expected {couplets / src.file}; is --data-dir right?")
    if val_size < 1:
        raise ValueError(f"val_size must be at least 1, got {val_size}")
    blocklist = blocklist or training_blocklist()
    stats = CleanStats()
    seen: set[tuple[str, str]] = set()
    by_source = {
        src.name: clean(read_tsv(couplets / src.file), src, blocklist, stats, seen)
        for src in SOURCES if (couplets / src.file).is_file()
    }
    splits = tuple(s for s in VAL_SPLITS if s.source in by_source)
    pins = read_pins() if val_size == PINNED_SIZE else None
    train, vals = split(by_source, stats, val_size, splits, pins)
    for p in train:
        stats.kept[f"train:{p.source}"] += 1
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(out_dir / "train.tsv", train)
    for s in splits:
        stats.kept[f"val:{s.source}:{s.file}"] = len(vals[s.file])
        write_pairs(out_dir / s.file, vals[s.file])
    (out_dir / "stats.json").write_text(
        json.dumps(stats.as_dict(), ensure_ascii=False, indent=2), encoding="utf-8"
    )
    return stats
