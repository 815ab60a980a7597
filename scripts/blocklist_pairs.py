"""Count the corpus pairs that each safety-list term removes.

Usage: python scripts/blocklist_pairs.py (upstream | audited) OUT.json

``upstream``: the upstream list as the old loader read it (multi-character terms folded to
simplified characters, single characters as listed); ``audited``: the training filter of
``resources/blocklist.tsv``. Over every pair of ../shared/data/couplets/*.tsv (normalised as
``chunlian data`` does), writes per term the pairs holding it (``contain``) and the pairs whose
first term it is (``first``, the order ``Blocklist.find`` reports), and per file the pairs
holding any term (``per_file``) and read (``total``). scripts/audit_blocklist.py reads the
upstream counts.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from pathlib import Path

from chunlian.text import normalize

ROOT = Path(__file__).resolve().parent.parent
COUPLETS = ROOT.parent / "shared" / "data" / "couplets"


def terms(which: str) -> set[str]:
    if which == "audited":
        from chunlian.data.blocklist import training_blocklist

        return set(training_blocklist().terms)
    import zhconv

    raw = (ROOT / "src" / "chunlian" / "resources" / "blocklist.upstream.txt").read_text(encoding="utf-8")
    return {t if len(t) == 1 else str(zhconv.convert(t, "zh-cn")) for t in raw.split() if t}


def main() -> None:
    listed = terms(sys.argv[1])
    singles = {t for t in listed if len(t) == 1}
    multi = {t for t in listed if len(t) > 1}
    prefixes = {t[:i] for t in multi for i in range(1, len(t))}

    def hits(text: str) -> list[str]:
        """The terms in ``text``: single characters in order, then by start and length."""
        out = [c for c in text if c in singles]
        for i in range(len(text)):
            j = i + 2
            while j <= len(text):
                if text[i:j] in multi:
                    out.append(text[i:j])
                if text[i:j] not in prefixes:
                    break
                j += 1
        return out

    contain: Counter[str] = Counter()
    first: Counter[str] = Counter()
    per_file: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for path in sorted(COUPLETS.glob("*.tsv")):
        with path.open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
                total[path.name] += 1
                u, lo = normalize(row.get("upper") or ""), normalize(row.get("lower") or "")
                hu, hl = hits(u), hits(lo)
                if not hu and not hl:
                    continue
                per_file[path.name] += 1
                contain.update(set(hu) | set(hl))
                first[(hu or hl)[0]] += 1  # ``hits`` lists single characters first
    out = {"contain": contain, "first": first, "per_file": per_file, "total": total}
    Path(sys.argv[2]).write_text(json.dumps(out, ensure_ascii=False, indent=0), encoding="utf-8")


if __name__ == "__main__":
    main()
