"""Sequence-level distillation data (training/distill.py): which lines are distilled, what
reaches the student's data directory, and what is refused."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from chunlian.data.corpus import Pair, read_pairs, write_pairs
from chunlian.errors import InvalidInput
from chunlian.training.distill import (
    TEACHER_STYLE,
    build_data_dir,
    read_distilled,
    run_teacher,
    sample_uppers,
)
from chunlian.types import CoupletRequest


@dataclass
class _Lines:
    lower: str


@dataclass
class _Res:
    best: _Lines


class FakeTeacher:
    """Answers each upper line with the characters of ``answer`` cut to its length; refuses
    the lines in ``refuse``; records what it was asked."""

    def __init__(self, answer: str = "春风送暖入屠苏", refuse: frozenset[str] = frozenset()) -> None:
        self.answer, self.refuse = answer, refuse
        self.asked: list[CoupletRequest] = []

    def generate(self, requests: list[CoupletRequest]) -> list[_Res | Exception]:
        self.asked.extend(requests)
        uppers = [r.upper or "" for r in requests]
        return [InvalidInput("refused", field="upper") if u in self.refuse
                else _Res(_Lines(self.answer[: len(u)])) for u in uppers]


def _pairs() -> list[Pair]:
    return [
        Pair("天增岁月人增寿", "春满乾坤福满门", "modern"),
        Pair("天增岁月人增寿", "福临门第喜临门", "modern"),  # the same upper line twice
        Pair("一帆风顺年年好", "万事如意步步高", "modern"),
        Pair("爆竹声中辞旧岁", "梅花香里报新春", "modern"),
        Pair("白日依山尽", "黄河入海流", "classical"),
        Pair("国泰民安", "人寿年丰", "modern"),
    ]


def test_sample_is_modern_distinct_seeded_and_a_larger_limit_extends_a_smaller() -> None:
    pairs = _pairs()
    big = sample_uppers(pairs, 10, seed=7)
    assert sorted(p.upper for p in big) == sorted({p.upper for p in pairs if p.register == "modern"})
    assert all(p.register == "modern" for p in big)
    assert sample_uppers(pairs, 10, seed=7) == big
    assert sample_uppers(pairs, 2, seed=7) == big[:2]
    orders = {tuple(p.upper for p in sample_uppers(pairs, 10, seed=s)) for s in range(10)}
    assert len(orders) > 1  # the seed does shuffle


def test_teacher_answers_are_appended_as_they_come_refusals_skipped_and_a_cut_line_ignored(tmp_path: Path) -> None:
    path = tmp_path / "distilled.jsonl"
    todo = [p for p in _pairs() if p.register == "modern"][2:]
    teacher = FakeTeacher(refuse=frozenset({"国泰民安"}))
    chunks: list[int] = []
    assert run_teacher(teacher, todo, path, chunk=2, on_chunk=chunks.append) == 2
    assert chunks == [2, 1]
    assert {r.style for r in teacher.asked} == {TEACHER_STYLE}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"upper": "一帆风顺年年好", "gold": "万事如意步步高", "lower": "春风送暖入屠苏"}
    with path.open("a", encoding="utf-8") as f:
        f.write('{"upper": "天增岁月人增寿", "lo')  # a stop in the middle of a write
    assert read_distilled(path) == {"一帆风顺年年好": "春风送暖入屠苏", "爆竹声中辞旧岁": "春风送暖入屠苏"}


def _data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    write_pairs(d / "train.tsv", _pairs())
    write_pairs(d / "val.tsv", [Pair("春回大地千山秀", "福到人间万象新", "modern")])
    return d


def test_data_dir_replaces_only_the_distilled_modern_lowers_and_copies_validation(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    out = tmp_path / "distill"
    stats = build_data_dir(data, out, {"天增岁月人增寿": "花开富贵家家乐", "白日依山尽": "青山映水流"})
    train = read_pairs(out / "train.tsv")
    assert [p.lower for p in train] == ["花开富贵家家乐", "花开富贵家家乐", "万事如意步步高", "梅花香里报新春",
                                        "黄河入海流", "人寿年丰"]  # the classical pair keeps its gold line
    assert [p.register for p in train] == [p.register for p in _pairs()]
    assert (out / "val.tsv").read_bytes() == (data / "val.tsv").read_bytes()
    assert stats == {"train_pairs": 6, "distilled_uppers": 2, "replaced_pairs": 2, "changed_pairs": 2, "copies": 1}
    assert json.loads((out / "stats.json").read_text(encoding="utf-8")) == stats
    stats3 = build_data_dir(data, tmp_path / "x3", {"天增岁月人增寿": "花开富贵家家乐"}, copies=3)
    train3 = read_pairs(tmp_path / "x3" / "train.tsv")
    assert stats3["train_pairs"] == len(train3) == 10
    assert [p for p in train3 if p.lower == "花开富贵家家乐"] == [Pair("天增岁月人增寿", "花开富贵家家乐", "modern")] * 6
    assert [p for p in train3 if p.lower != "花开富贵家家乐"] == [p for p in _pairs() if p.upper != "天增岁月人增寿"]
    with pytest.raises(ValueError, match="at least 1"):
        build_data_dir(data, tmp_path / "x0", {}, copies=0)


def test_data_dir_refuses_a_validation_line_or_a_lower_of_another_length(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    with pytest.raises(ValueError, match="validation lines"):
        build_data_dir(data, tmp_path / "a", {"春回大地千山秀": "花开富贵家家乐"})
    with pytest.raises(ValueError, match="differ in length"):
        build_data_dir(data, tmp_path / "b", {"国泰民安": "花开富贵家"})
    assert not (tmp_path / "a" / "train.tsv").exists() and not (tmp_path / "b" / "train.tsv").exists()


def test_cli_resumes_from_a_finished_file_without_the_teacher_and_refuses_a_missing_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from chunlian.cli import main

    data = _data_dir(tmp_path)
    out = tmp_path / "distill"
    out.mkdir()
    uppers = [p.upper for p in sample_uppers(read_pairs(data / "train.tsv"), 2)]
    with (out / "distilled.jsonl").open("w", encoding="utf-8") as f:
        for u in uppers:
            f.write(json.dumps({"upper": u, "gold": "", "lower": "和" * len(u)}, ensure_ascii=False) + "\n")
    # every sampled line is already distilled: the data directory is built, no model is loaded
    assert main(["distill", "--data", str(data), "--out", str(out), "--limit", "2", "--quiet"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["distilled_uppers"] == 2 and stats["replaced_pairs"] >= 2
    assert {p.lower for p in read_pairs(out / "train.tsv") if p.upper in uppers} == {"和" * len(u) for u in uppers}
    assert main(["distill", "--data", str(tmp_path / "none"), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "has no train.tsv" in captured.err
    before = (data / "train.tsv").read_bytes()
    assert main(["distill", "--data", str(data), "--out", str(data)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "would be overwritten" in captured.err
    assert (data / "train.tsv").read_bytes() == before
    with pytest.raises(ValueError, match="would be overwritten"):
        build_data_dir(data, data, {})
    assert main(["distill", "--data", str(data), "--out", str(out), "--threads", "-1"]) == 2
    assert "--threads must be 0" in capsys.readouterr().err
