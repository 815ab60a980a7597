"""Write src/chunlian/resources/head_words.tsv: what may follow a name's head (``chunlian.names``).

    python scripts/build_head_words.py [--corpus runs/data/train.tsv] [--min-count 3]

A head character of a 藏头 couplet is most often a given-name character (娜, 婷, 敏) that
rarely opens a word, and the model then invents one (娜郎, 玲水, 婷角). The table lists, for
each head it covers, the characters that follow it at least ``--min-count`` times inside a
line of the training pairs: the two characters are a word (or a phrase) people wrote. Heads
covered: every character of the campaign's names (``data/campaign/names.tsv``) and the
``--top`` most frequent characters of the corpus. One row a head: ``head<TAB>continuations``,
most frequent first.
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "chunlian" / "resources" / "head_words.tsv"


def is_han(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "runs" / "data" / "train.tsv")
    ap.add_argument("--min-count", type=int, default=3)
    ap.add_argument("--top", type=int, default=0)
    args = ap.parse_args()
    pairs: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    with args.corpus.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            for line in (row["upper"], row["lower"]):
                chars.update(c for c in line if is_han(c))
                pairs.update(a + b for a, b in zip(line, line[1:], strict=False) if is_han(a) and is_han(b))
    with (ROOT / "data" / "campaign" / "names.tsv").open(encoding="utf-8", newline="") as f:
        heads = {c for row in csv.DictReader(f, delimiter="\t") for c in row["name"]}
    heads |= {c for c, _ in chars.most_common(args.top)}
    nexts: dict[str, list[tuple[int, str]]] = {}
    for p, n in pairs.items():
        if n >= args.min_count and p[0] in heads:
            nexts.setdefault(p[0], []).append((-n, p[1]))
    with OUT.open("w", encoding="utf-8") as f:
        for h in sorted(nexts):
            f.write(h + "\t" + "".join(c for _, c in sorted(nexts[h])) + "\n")
    print(f"{len(nexts)} heads -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
