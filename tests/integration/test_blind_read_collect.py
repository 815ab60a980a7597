"""benchmarks/blind_read.py collect: it starts a real ``chunlian serve`` on 127.0.0.1 for the
weights it is given, asks it for a handful of campaign inputs as the page does, and records
every answer and refusal; the sheet made from them is blind."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.integration.live_server import model_path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_collect_through_a_served_model_then_sheet(tmp_path: Path) -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    br = importlib.import_module("blind_read")
    weights = model_path(tmp_path)
    runs = tmp_path / "runs"
    argv = ["collect", "--name", "it", "--runs", str(runs), "--model", str(weights),
            "--systems", "fast,best", "--limit", "3", "--names", "3", "--timeout-ms", "30000"]
    assert br.main(argv) == 0
    records = [json.loads(line) for line in (runs / "it" / "answers.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2 * 9
    assert {(r["system"], r["kind"]) for r in records} == {
        (s, k) for s in ("fast", "best") for k in ("line", "name", "keyword")}
    for r in records:
        assert r["status"] in (200, 422), r
        if r["ok"]:
            assert r["upper"] and len(r["lower"]) == len(r["upper"]) and r["hengpi"], r
            assert r["cached"] is False  # the service started here has no result cache
        else:
            assert r["code"] == "invalid_input" and r["field"] == "heads", r
    lines = [r for r in records if r["kind"] == "line"]
    assert all(r["ok"] and r["served"] == r["system"] for r in lines)
    keywords = [r for r in records if r["kind"] == "keyword"]
    assert all(r["ok"] and r["upper"].startswith(r["input"]) for r in keywords)
    report = json.loads((runs / "it" / "collect.json").read_text(encoding="utf-8"))
    assert report["inputs"] == {"line": 3, "name": 3, "keyword": 3}
    assert set(report["systems"]) == {"fast", "best"}

    assert br.main(["sheet", "--name", "it", "--runs", str(runs)]) == 0
    sheet = (runs / "it" / "judge" / "sheet.tsv").read_text(encoding="utf-8")
    assert "fast" not in sheet and "best" not in sheet
    key = json.loads((runs / "it" / "key.json").read_text(encoding="utf-8"))
    assert len(sheet.splitlines()) == 1 + len(key["items"])
    assert len(key["errors"]) == sum(not r["ok"] for r in records)
