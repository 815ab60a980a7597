"""Validation lines side by side, for a reader to judge: the real 下联, greedy on the shipped
weights, greedy on other weights (a distilled student), and the quality mode.

    python benchmarks/side_by_side.py --val runs/data/val.tsv --lines 40 \
        --student runs/student/latest.safetensors --out runs/side_by_side.md

Takes every k-th pair of the split so the lines spread over it (``--lines`` of them, the
same ones on every run). Prints a Markdown table; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chunlian.data.blocklist import default_blocklist
from chunlian.offline import OfflineGenerator, couplet_request
from chunlian.training.eval_run import read_eval_pairs
from chunlian.types import CoupletResult


def lowers(gen: OfflineGenerator, uppers: list[str]) -> list[str]:
    out = gen.generate([couplet_request(u) for u in uppers])
    return [r.best.lower if isinstance(r, CoupletResult) else f"({r.code})" for r in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--student", type=Path, required=True, help="the other weights, decoded greedily")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    pairs = read_eval_pairs(args.val, None)
    step = max(1, len(pairs) // args.lines)
    picked = pairs[::step][: args.lines]
    uppers = [u for u, _ in picked]
    bans = default_blocklist()  # no zodiac rule, as chunlian eval decodes
    columns = {
        "shipped greedy": lowers(OfflineGenerator.load(None, "cpu", capacity=64, blocklist=bans), uppers),
        "student greedy": lowers(OfflineGenerator.load(args.student, "cpu", capacity=64, blocklist=bans), uppers),
        "best (quality mode)": lowers(OfflineGenerator.load_quality("cpu", 64, bans), uppers),
    }
    head = ["上联", "real 下联", *columns]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, (u, ref) in enumerate(picked):
        rows.append("| " + " | ".join([u, ref, *(c[k] for c in columns.values())]) + " |")
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
