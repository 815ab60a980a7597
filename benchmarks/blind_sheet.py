"""The blind read's sheet, key and scores (``benchmarks/blind_read.py`` runs them).

* ``make_sheet``: the answers of every system, shuffled with a seed into items numbered in
  sheet order, so that neither a label nor the order of the systems reaches the judge. Two
  systems' identical couplets for one input are one item, credited to both (with
  ``dedupe=False``, each answer is its own item).
* ``score``: per system and input kind, the share of answers a judge accepts, with a 95%
  Wilson interval; per judge and for "every judge accepts"; plus the judges' agreement
  (share agreeing and Cohen's kappa). An answer the service refused or failed is on no
  sheet and counts as not acceptable.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("line", "name", "keyword")
SHEET_COLUMNS = ("item", "kind", "input", "upper", "lower", "hengpi")
Z_95 = 1.959964


@dataclass(frozen=True)
class Judged:
    """One judge's verdicts: item id -> accepted."""

    judge: str
    verdicts: dict[str, bool]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def couplet_of(answer: dict[str, Any]) -> tuple[str, str, str]:
    return answer.get("upper") or "", answer.get("lower") or "", answer.get("hengpi") or ""


def make_sheet(answers: Sequence[dict[str, Any]], seed: int,
               dedupe: bool = True) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """(sheet rows, key) from collected answers (each: ``system``, ``kind``, ``input``,
    ``ok`` and, when ok, ``upper``, ``lower``, ``hengpi``)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    errors: list[dict[str, Any]] = []
    for n, a in enumerate(answers):
        if not a.get("ok"):
            errors.append({k: a.get(k) for k in ("system", "kind", "input", "status", "code", "message")})
            continue
        ident: tuple[str, ...] = (a["kind"], a["input"], *couplet_of(a))
        if not dedupe:
            ident = (*ident, str(n))
        groups.setdefault(ident, []).append(a["system"])
    # sorted first, so that the shuffle alone (not the order answers arrived in) sets the order
    entries = sorted(groups.items())
    random.Random(seed).shuffle(entries)
    sheet: list[dict[str, str]] = []
    items: dict[str, dict[str, Any]] = {}
    for i, (ident, systems) in enumerate(entries, 1):
        item = f"{i:04d}"
        kind, text, upper, lower, hengpi = ident[:5]
        sheet.append({"item": item, "kind": kind, "input": text, "upper": upper,
                      "lower": lower, "hengpi": hengpi})
        items[item] = {"systems": sorted(set(systems)), "kind": kind, "input": text}
    systems_all = sorted({a["system"] for a in answers})
    key = {"seed": seed, "dedupe": dedupe, "systems": systems_all, "items": items,
           "errors": errors, "counts": answer_counts(answers, systems_all)}
    return sheet, key


def answer_counts(answers: Iterable[dict[str, Any]], systems: Sequence[str]) -> dict[str, Any]:
    """system -> kind -> {"answered", "errors"}."""
    out = {s: {k: {"answered": 0, "errors": 0} for k in KINDS} for s in systems}
    for a in answers:
        out[a["system"]][a["kind"]]["answered" if a.get("ok") else "errors"] += 1
    return out


def write_sheet(path: Path, rows: Sequence[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SHEET_COLUMNS, delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def read_judgments(path: Path, judge: str | None = None) -> Judged:
    """A judge's file: TSV rows ``item<TAB>1|0`` (a header row is skipped), or JSONL
    objects ``{"item": ..., "accept": 1|0}``. The judge is named after the file."""
    verdicts: dict[str, bool] = {}
    if path.suffix == ".jsonl":
        pairs = [(str(o["item"]), str(o["accept"])) for o in read_jsonl(path)]
    else:
        with path.open(encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        pairs = [(r[0].strip(), r[1].strip() if len(r) > 1 else "") for r in rows]
        if pairs and pairs[0][1] not in ("0", "1"):
            pairs = pairs[1:]
    for item, mark in pairs:
        if mark not in ("0", "1", "True", "False", "true", "false"):
            raise ValueError(f"{path}: item {item}: the verdict must be 1 or 0, not {mark!r}")
        verdicts[item] = mark in ("1", "True", "true")
    return Judged(judge or path.stem, verdicts)


def wilson(accepted: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion, as fractions; (0, 1) with no answers."""
    if n == 0:
        return 0.0, 1.0
    p = accepted / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two judges' verdicts on the same items; None with no items, 1.0 when
    both give one same verdict throughout (chance agreement is then total, and so is theirs)."""
    n = len(a)
    if n == 0:
        return None
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    if chance >= 1.0:
        return 1.0 if agree == 1.0 else 0.0
    return (agree - chance) / (1 - chance)


def cell(accepted: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(accepted, n)
    return {"accepted": accepted, "n": n, "pct": round(100 * accepted / n, 1) if n else None,
            "ci95_pct": [round(100 * lo, 1), round(100 * hi, 1)]}


def score(key: dict[str, Any], judged: Sequence[Judged]) -> dict[str, Any]:
    """Acceptance per system x kind (and over all kinds), per judge and for all judges."""
    items: dict[str, dict[str, Any]] = key["items"]
    for j in judged:
        missing = sorted(set(items) - set(j.verdicts))
        if missing:
            raise ValueError(f"judge {j.judge} has no verdict for {len(missing)} items, e.g. {missing[:5]}")
    judges = [j.judge for j in judged]
    verdict_sets = {**{j.judge: j.verdicts for j in judged},
                    "all judges": {i: all(j.verdicts[i] for j in judged) for i in items}}
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for system in key["systems"]:
        table[system] = {}
        for kind in (*KINDS, "all"):
            kinds = KINDS if kind == "all" else (kind,)
            mine = [i for i, v in items.items() if system in v["systems"] and v["kind"] in kinds]
            errors = sum(key["counts"][system][k]["errors"] for k in kinds)
            n = len(mine) + errors
            if n == 0:
                continue
            table[system][kind] = {who: cell(sum(v[i] for i in mine), n)
                                   for who, v in verdict_sets.items()}
            table[system][kind]["errors"] = {"n": errors}
    return {"judges": judges, "table": table, "agreement": agreement(judged, sorted(items))}


def agreement(judged: Sequence[Judged], items: Sequence[str]) -> list[dict[str, Any]]:
    """Every pair of judges: how many sheet items they agree on, and Cohen's kappa."""
    out = []
    for x in range(len(judged)):
        for y in range(x + 1, len(judged)):
            a = [judged[x].verdicts[i] for i in items]
            b = [judged[y].verdicts[i] for i in items]
            same = sum(p == q for p, q in zip(a, b, strict=True))
            kappa = cohen_kappa(a, b)
            out.append({"judges": [judged[x].judge, judged[y].judge], "items": len(items),
                        "agree_pct": round(100 * same / len(items), 1) if items else None,
                        "kappa": None if kappa is None else round(kappa, 3)})
    return out


def markdown(result: dict[str, Any]) -> str:
    """The scores as a Markdown table (acceptance % [95% interval], accepted/n)."""
    who = [*result["judges"], "all judges"]
    head = ["system", "input", *who, "errors"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, kinds in result["table"].items():
        for kind, cells in kinds.items():
            shown = [f"{c['pct']}% [{c['ci95_pct'][0]}, {c['ci95_pct'][1]}] ({c['accepted']}/{c['n']})"
                     for c in (cells[w] for w in who)]
            lines.append("| " + " | ".join([system, kind, *shown, str(cells["errors"]["n"])]) + " |")
    for pair in result["agreement"]:
        lines.append(f"\n{pair['judges'][0]} and {pair['judges'][1]}: agree on {pair['agree_pct']}% "
                     f"of {pair['items']} items, Cohen's kappa {pair['kappa']}")
    return "\n".join(lines) + "\n"
