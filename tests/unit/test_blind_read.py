"""benchmarks/blind_read.py and blind_sheet.py: the sheet is blind, the key credits the right
systems, and the scores and intervals are right on hand-made examples."""

from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:  # blind_read imports blind_sheet as its script would
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


bs = _load("blind_sheet")
br = _load("blind_read")


def answer(system: str, kind: str, text: str, lower: str, ok: bool = True) -> dict[str, Any]:
    if not ok:
        return {"system": system, "kind": kind, "input": text, "ok": False, "status": 422,
                "code": "invalid_input", "message": "heads is too long"}
    upper = text if kind == "line" else text[0] + "年好运福满门"
    return {"system": system, "kind": kind, "input": text, "ok": True, "upper": upper,
            "lower": lower, "hengpi": "万象更新", "served": system}


def answers() -> list[dict[str, Any]]:
    out = []
    for i in range(20):
        text = f"春{i:02d}"
        out.append(answer("fast", "line", text, f"快{i:02d}"))
        out.append(answer("best", "line", text, f"好{i:02d}"))
    out.append(answer("fast", "name", "王伟", "伟业宏图步步高"))
    out.append(answer("best", "name", "王伟", "伟业宏图步步高"))  # the same couplet
    out.append(answer("fast", "name", "王秀英", "", ok=False))
    out.append(answer("best", "name", "王秀英", "", ok=False))
    return out


def test_sheet_names_no_system_and_credits_identical_answers_to_both() -> None:
    sheet, key = bs.make_sheet(answers(), seed=1)
    assert len(sheet) == 41  # 20 inputs x 2 systems, plus one couplet both wrote
    text = json.dumps(sheet, ensure_ascii=False)
    assert "fast" not in text and "best" not in text
    assert set(sheet[0]) == set(bs.SHEET_COLUMNS)
    assert [r["item"] for r in sheet] == [f"{i:04d}" for i in range(1, 42)]
    shared = [i for i, v in key["items"].items() if v["kind"] == "name"]
    assert len(shared) == 1 and key["items"][shared[0]]["systems"] == ["best", "fast"]
    assert {e["input"] for e in key["errors"]} == {"王秀英"} and len(key["errors"]) == 2
    assert key["counts"]["fast"]["name"] == {"answered": 1, "errors": 1}
    sheet2, key2 = bs.make_sheet(answers(), seed=1, dedupe=False)
    assert len(sheet2) == 42 and all(len(v["systems"]) == 1 for v in key2["items"].values())


def test_sheet_order_owes_nothing_to_labels_or_arrival_order() -> None:
    swapped = [{**a, "system": {"fast": "best", "best": "fast"}[a["system"]]} for a in answers()]
    sheet_a, _ = bs.make_sheet(answers(), seed=7)
    sheet_b, _ = bs.make_sheet(list(reversed(swapped)), seed=7)
    assert sheet_a == sheet_b
    # shuffled: the sheet does not list one system's answers, then the other's
    _, key = bs.make_sheet(answers(), seed=7)
    first_half = [key["items"][f"{i:04d}"]["systems"] for i in range(1, 21)]
    assert 5 <= sum(s == ["fast"] for s in first_half) <= 15
    assert bs.make_sheet(answers(), seed=8)[0] != sheet_a


def test_wilson_interval_values() -> None:
    assert [round(x, 4) for x in bs.wilson(8, 10)] == [0.4902, 0.9433]
    assert [round(x, 4) for x in bs.wilson(0, 10)] == [0.0, 0.2775]
    assert [round(x, 4) for x in bs.wilson(50, 100)] == [0.4038, 0.5962]
    assert [round(x, 4) for x in bs.wilson(10, 10)] == [0.7225, 1.0]
    assert bs.wilson(0, 0) == (0.0, 1.0)


def test_cohen_kappa() -> None:
    assert bs.cohen_kappa([True, True, False, False], [True, False, False, False]) == pytest.approx(0.5)
    assert bs.cohen_kappa([True, False], [False, True]) == pytest.approx(-1.0)
    assert bs.cohen_kappa([True, True], [True, True]) == 1.0
    assert bs.cohen_kappa([], []) is None


def small_key() -> dict[str, Any]:
    """Two systems; fast: 3 lines and 1 refused name; best: 3 lines; item 0004 is both's."""
    items = {"0001": {"systems": ["fast"], "kind": "line", "input": "甲"},
             "0002": {"systems": ["fast"], "kind": "line", "input": "乙"},
             "0003": {"systems": ["best"], "kind": "line", "input": "甲"},
             "0004": {"systems": ["best", "fast"], "kind": "line", "input": "丙"},
             "0005": {"systems": ["best"], "kind": "line", "input": "乙"}}
    counts = {s: {k: {"answered": 0, "errors": 0} for k in bs.KINDS} for s in ("best", "fast")}
    counts["fast"]["name"]["errors"] = 1
    return {"systems": ["best", "fast"], "items": items, "errors": [], "counts": counts}


def test_score_per_judge_all_judges_and_agreement() -> None:
    a = bs.Judged("a", {"0001": True, "0002": False, "0003": True, "0004": True, "0005": True})
    b = bs.Judged("b", {"0001": True, "0002": False, "0003": False, "0004": True, "0005": True})
    result = bs.score(small_key(), [a, b])
    best, fast = result["table"]["best"], result["table"]["fast"]
    assert best["line"]["a"]["accepted"] == 3 and best["line"]["a"]["n"] == 3
    assert best["line"]["b"]["accepted"] == 2 and best["line"]["all judges"]["accepted"] == 2
    assert fast["line"]["a"]["pct"] == pytest.approx(66.7)
    assert fast["name"]["a"] == {"accepted": 0, "n": 1, "pct": 0.0, "ci95_pct": [0.0, 79.3]}
    assert fast["all"]["a"]["accepted"] == 2 and fast["all"]["a"]["n"] == 4
    assert fast["all"]["errors"] == {"n": 1}
    assert "keyword" not in fast
    (pair,) = result["agreement"]
    assert pair["agree_pct"] == 80.0 and pair["kappa"] == pytest.approx(0.545, abs=1e-3)
    table = bs.markdown(result)
    assert "| best | line | 100.0% [43.9, 100.0] (3/3) | 66.7% [20.8, 93.9] (2/3) |" in table


def test_score_refuses_a_judge_with_missing_items() -> None:
    with pytest.raises(ValueError, match="no verdict for 1 items"):
        bs.score(small_key(), [bs.Judged("a", {f"000{i}": True for i in range(1, 5)})])


def test_judgment_files_tsv_with_header_and_jsonl(tmp_path: Path) -> None:
    tsv = tmp_path / "judge-a.tsv"
    tsv.write_text("item\taccept\n0001\t1\n0002\t0\n", encoding="utf-8")
    assert bs.read_judgments(tsv) == bs.Judged("judge-a", {"0001": True, "0002": False})
    jl = tmp_path / "b.jsonl"
    jl.write_text('{"item": "0001", "accept": 0}\n{"item": "0002", "accept": 1}\n', encoding="utf-8")
    assert bs.read_judgments(jl).verdicts == {"0001": False, "0002": True}
    bad = tmp_path / "c.tsv"
    bad.write_text("0001\t1\n0002\tyes\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must be 1 or 0"):
        bs.read_judgments(bad)


def test_sheet_and_score_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "t"
    run.mkdir()
    with (run / "answers.jsonl").open("w", encoding="utf-8") as f:
        for a in answers():
            f.write(json.dumps(a, ensure_ascii=False) + "\n")
    assert br.main(["sheet", "--name", "t", "--runs", str(tmp_path)]) == 0
    judge = run / "judge"
    assert (judge / "rubric.md").read_text(encoding="utf-8") == br.RUBRIC.read_text(encoding="utf-8")
    with (judge / "sheet.tsv").open(encoding="utf-8") as f:
        sheet = list(csv.DictReader(f, delimiter="\t"))
    assert len(sheet) == 41 and "fast" not in (judge / "sheet.tsv").read_text(encoding="utf-8")
    template = (judge / "judgments-template.tsv").read_text(encoding="utf-8").splitlines()
    assert template[0] == "item\taccept" and len(template) == 42
    key = json.loads((run / "key.json").read_text(encoding="utf-8"))
    verdict = tmp_path / "j1.tsv"  # accepts exactly best's answers
    verdict.write_text("".join(f"{i}\t{int('best' in v['systems'])}\n" for i, v in key["items"].items()))
    assert br.main(["score", "--name", "t", "--runs", str(tmp_path), str(verdict)]) == 0
    result = json.loads((run / "score.json").read_text(encoding="utf-8"))
    assert result["table"]["best"]["line"]["j1"]["pct"] == 100.0
    assert result["table"]["fast"]["line"]["j1"]["pct"] == 0.0
    assert result["table"]["best"]["name"]["j1"] == {"accepted": 1, "n": 2, "pct": 50.0,
                                                     "ci95_pct": [9.5, 90.5]}
    assert "| fast | line | 0.0%" in capsys.readouterr().out


def test_requests_are_the_pages_and_loopback_only() -> None:
    assert br.request_of("line", "老板发了年终奖", {"quality": "best"}) == (
        "/v1/couplets", {"upper": "老板发了年终奖", "style": "traditional", "quality": "best"})
    assert br.request_of("name", "王伟", {"quality": "fast"}) == (
        "/v1/couplets/compose", {"heads": "王伟", "length": 7, "style": "traditional", "quality": "fast"})
    assert br.request_of("keyword", "新春", {})[1]["keyword"] == "新春"
    assert br.check_loopback("http://127.0.0.1:8155/") == "http://127.0.0.1:8155"
    with pytest.raises(SystemExit, match="loopback"):
        br.check_loopback("http://example.com:8155")


def test_default_systems_and_a_candidate() -> None:
    args = br.parse_args(["collect", "--name", "x", "--url", "http://127.0.0.1:1",
                          "--candidate", "w.safetensors"])
    systems = br.systems_of(args)
    assert [s.label for s in systems] == ["fast", "best", "auto", "candidate-fast",
                                          "candidate-best", "candidate-auto"]
    assert [s.concurrency for s in systems] == [2, 2, 1, 2, 2, 1]
    assert systems[0].url == "http://127.0.0.1:1" and systems[3].url is None
    assert systems[3].model == Path("w.safetensors")
    assert all(s.search is None for s in systems)


def test_a_candidate_with_its_own_search_weights() -> None:
    args = br.parse_args(["collect", "--name", "x", "--systems", "fast,best",
                          "--candidate", "w.safetensors", "--candidate-search", "r.safetensors"])
    systems = br.systems_of(args)
    assert [(s.label, s.model, s.search) for s in systems] == [
        ("fast", None, None), ("best", None, None),
        ("candidate-fast", Path("w.safetensors"), Path("r.safetensors")),
        ("candidate-best", Path("w.safetensors"), Path("r.safetensors"))]


def test_campaign_inputs() -> None:
    inputs = br.load_inputs(200, ("line", "name", "keyword"))
    kinds = [k for k, _ in inputs]
    assert kinds.count("name") == 200 and kinds.count("line") >= 150 and kinds.count("keyword") >= 30
    assert br.load_inputs(3, ("name",), limit=2) == [("name", "张伟"), ("name", "王伟")]
    held_out = br.load_inputs(400, ("name",), skip_names=200)
    assert len(held_out) == 200 and not {t for _, t in held_out} & {t for _, t in inputs}
