"""data/campaign: the files parse, meet the counts the blind read needs, and no training or
validation pair shares a line with the set's everyday lines."""

from __future__ import annotations

import csv
import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from chunlian.text import is_han
from chunlian.training.distill import upper_key

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "data" / "campaign"
CORPORA = ROOT.parent / "shared" / "data" / "couplets"
SPLITS = ROOT / "runs" / "data"
THEMES = {"family", "study", "work", "travel", "modern", "customs", "wishes", "business", "zodiac"}


def rows(name: str) -> list[dict[str, str]]:
    with (CAMPAIGN / name).open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def han(text: str) -> str:
    return "".join(ch for ch in text if is_han(ch))


LINES = rows("lines.tsv")
NAMES = rows("names.tsv")
KEYWORDS = rows("keywords.tsv")


def test_everyday_lines_parse_and_cover_every_theme() -> None:
    assert len(LINES) >= 150
    assert {r["theme"] for r in LINES} == THEMES
    assert len({r["id"] for r in LINES}) == len(LINES)
    assert len({han(r["upper"]) for r in LINES}) == len(LINES)
    for r in LINES:
        # Han characters and at most the clause comma; 5 to 11 characters without it
        assert re.fullmatch(r"[^，]+(，[^，]+)?", r["upper"]), r
        assert all(is_han(ch) for ch in r["upper"].replace("，", "")), r
        assert 5 <= len(han(r["upper"])) <= 11, r
    lengths = Counter(len(han(r["upper"])) for r in LINES)
    assert {5, 6, 7, 8, 9, 10, 11} <= set(lengths)
    assert sum("，" in r["upper"] for r in LINES) >= 3


def test_names_are_ranked_two_or_three_han_characters() -> None:
    assert len(NAMES) >= 500
    assert [int(r["rank"]) for r in NAMES] == list(range(1, len(NAMES) + 1))
    names = [r["name"] for r in NAMES]
    assert len(set(names)) == len(names)
    for r in NAMES:
        assert len(r["name"]) in (2, 3) and all(is_han(ch) for ch in r["name"]), r
        assert int(r["chars"]) == len(r["name"])
    top = names[:500]
    share3 = sum(len(n) == 3 for n in top) / len(top)
    assert 0.25 <= share3 <= 0.4
    assert {"王伟", "杨帆", "王秀英", "李建国", "王丹丹"} <= set(top)
    assert sum(len(n) == 3 and n[1] == n[2] for n in top) >= 3


def test_names_file_is_what_its_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("build_campaign_names",
                                                  ROOT / "scripts" / "build_campaign_names.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (CAMPAIGN / "names.tsv").read_text(encoding="utf-8") == module.render(module.build())


def test_keywords_parse() -> None:
    assert len(KEYWORDS) >= 30
    words = [r["keyword"] for r in KEYWORDS]
    assert len(set(words)) == len(words)
    for w in words:
        assert 1 <= len(w) <= 4 and all(is_han(ch) for ch in w), w
    assert {"新春", "万福", "发财", "平安", "团圆", "考研", "高铁"} <= set(words)


def pair_files() -> list[Path]:
    files = sorted(CORPORA.glob("*.tsv")) + sorted(SPLITS.glob("*.tsv"))
    return [f for f in files if f.is_file()]


def test_no_training_or_validation_pair_shares_a_line_with_the_set() -> None:
    if not CORPORA.is_dir():
        pytest.skip(f"the corpora are not here ({CORPORA}): nothing to compare with")
    ours = {han(r["upper"]): r["upper"] for r in LINES}
    shared: dict[str, set[str]] = {}
    for path in pair_files():
        with path.open(encoding="utf-8") as f:
            next(f)
            for line in f:
                upper, lower = line.rstrip("\n").split("\t")[:2]
                for side in (upper, lower):
                    if han(side) in ours:
                        shared.setdefault(ours[han(side)], set()).add(path.name)
    assert not shared, f"campaign lines found in training or validation data: {shared}"


def test_no_distilled_row_names_a_campaign_line() -> None:
    """The distillation set names its 上联 by hash and holds generated 下联s."""
    keys = {upper_key(r["upper"]): r["upper"] for r in LINES}
    ours = {han(r["upper"]) for r in LINES}
    files = sorted((ROOT / "data" / "distilled").glob("*.tsv"))
    assert files
    for path in files:
        with path.open(encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                assert row["key"] not in keys, (path.name, keys.get(row["key"]))
                assert han(row["best"]) not in ours and han(row["nearest"]) not in ours, row
