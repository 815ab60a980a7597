"""The distillation set kept with the code (data/distilled): well formed, its manifests true to
its files, and written by the shipped quality mode, so ``chunlian distill --out-dir
data/distilled`` can go on adding to it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from chunlian.data.corpus import read_rows
from chunlian.engine.tiers import BEST
from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS, load_weights
from chunlian.training.distill import DISTILLED, FIELDS, set_files

SET = Path(__file__).resolve().parents[2] / "data" / "distilled"
PUNCT = re.compile(r"[，、；。！？：]")
REGISTERS = {"modern", "classical"}


@pytest.fixture(scope="module")
def shards() -> dict[Path, list[dict[str, str]]]:
    files = set_files(SET)
    assert files, f"no shard in {SET}"
    return {f: read_rows(f) for f in files}


def test_rows_name_each_upper_once_by_key_with_two_lines_of_one_form(shards: dict[Path, list[dict[str, str]]]) -> None:
    keys: set[str] = set()
    for f, rows in shards.items():
        assert f.name.startswith(f"{DISTILLED}-") and list(rows[0]) == list(FIELDS)
        for r in rows:
            assert re.fullmatch(r"[0-9a-f]{16}", r["key"]) and r["key"] not in keys, (f, r)
            keys.add(r["key"])
            assert r["register"] in REGISTERS and r["best"] and len(r["best"]) == len(r["nearest"]), (f, r)
            # both lines answer the same 上联, so they share its punctuation
            assert [m.span() for m in PUNCT.finditer(r["best"])] == [m.span() for m in PUNCT.finditer(r["nearest"])]


def test_each_manifest_counts_its_file_and_names_the_shipped_teacher(shards: dict[Path, list[dict[str, str]]]) -> None:
    search, rescore = load_weights(QUALITY_WEIGHTS).tag, load_weights(DEFAULT_WEIGHTS).tag
    for f, rows in shards.items():
        manifest = json.loads(f.with_suffix(".json").read_text(encoding="utf-8"))
        assert manifest["rows"] == len(rows) and manifest["columns"] == list(FIELDS)
        assert (manifest["search_weights"], manifest["rescore_weights"]) == (search, [rescore]), \
            f"{f} was written by another teacher: start a new set for the shipped weights"
        assert manifest["preset"] == asdict(BEST)
