"""The cleaning rules of the data pipeline, on small synthetic inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunlian.data.blocklist import Blocklist
from chunlian.data.corpus import (
    CleanStats,
    Pair,
    clean,
    drop_reason,
    prepare,
    read_pairs,
    split,
)


@pytest.mark.parametrize(
    ("upper", "lower", "reason"),
    [
        ("天增岁月人增寿", "春满乾坤福满门", None),
        ("春来，福到", "花开，喜临", None),
        ("", "春满乾坤", "empty"),
        ("天增岁月人增寿", "春满乾坤福满", "length_mismatch"),
        ("春来，福到", "花开喜，临", "punct_mismatch"),
        ("春来，福到", "花开、喜临", "punct_mismatch"),  # same place, other mark
        ("春来ab到", "花开cd临", "non_chinese"),
        ("，春来福到", "，花开喜临", "non_chinese"),  # must begin with a Han character
        ("春来福到，", "花开喜临，", "non_chinese"),
        ("春" * 33, "花" * 33, "too_long"),
        ("春满乾坤", "春满乾坤", "identical_lines"),
    ],
)
def test_drop_reason(upper: str, lower: str, reason: str | None) -> None:
    assert drop_reason(upper, lower, None) == reason


def test_thirty_two_characters_are_allowed() -> None:
    assert drop_reason("春" * 32, "花" * 32, None) is None


def _blocklist(tmp_path: Path, terms: list[str]) -> Blocklist:
    path = tmp_path / "blocklist.txt"
    path.write_text("\n".join(terms) + "\n", encoding="utf-8")
    return Blocklist.from_file(path)


def test_blocklisted_terms_in_either_line_drop_the_pair(tmp_path: Path) -> None:
    bl = _blocklist(tmp_path, ["賭場", "屌"])
    # 賭場 is listed in traditional characters; it must match the simplified 赌场.
    assert drop_reason("春来赌场开", "花开喜临门", bl) == "blocklisted"
    assert drop_reason("花开喜临门", "春来赌场开", bl) == "blocklisted"
    assert drop_reason("春来屌到门", "花开喜临家", bl) == "blocklisted"
    assert drop_reason("春来福到门", "花开喜临家", bl) is None


def test_traditional_single_characters_stay_in_their_listed_form(tmp_path: Path) -> None:
    bl = _blocklist(tmp_path, ["區"])
    assert drop_reason("春满区城", "花开新市", bl) is None  # 区 is an everyday character
    assert drop_reason("春满區城", "花开新市", bl) == "blocklisted"


def test_clean_normalises_then_removes_duplicates_across_registers() -> None:
    stats = CleanStats()
    seen: set[tuple[str, str]] = set()
    modern = clean(
        [
            ("春来, 福到", "花开, 喜临"),  # ASCII comma and a space: normalised
            ("春来，福到", "花开，喜临"),  # the same pair once normalised
            ("天增岁月人增寿", "春满乾坤福满门"),
            ("天增岁月人增寿", "春满乾坤福满"),
        ],
        "modern", None, stats, seen,
    )
    classical = clean([("天增岁月人增寿", "春满乾坤福满门"), ("山高月小", "水落石出")],
                      "classical", None, stats, seen)
    assert modern == [Pair("春来，福到", "花开，喜临", "modern"),
                      Pair("天增岁月人增寿", "春满乾坤福满门", "modern")]
    assert classical == [Pair("山高月小", "水落石出", "classical")]
    assert stats.read == {"modern": 4, "classical": 2}
    assert stats.dropped == {
        "modern:duplicate": 1, "modern:length_mismatch": 1, "classical:duplicate": 1,
    }


def _modern_pairs() -> list[Pair]:
    pairs = []
    for i in range(60):
        a = chr(0x4E00 + 2 * i)
        b = chr(0x4E00 + 2 * i + 1)
        up, lo = f"春{a}福{a}", f"花{b}喜{b}"
        pairs.append(Pair(up, lo, "modern"))
        # the same couplet punctuated: must land on the same side of the split
        pairs.append(Pair(f"春{a}，福{a}", f"花{b}，喜{b}", "modern"))
    # a training pair sharing only its lower line with pair 0
    pairs.append(Pair("冬雪夏雨", f"花{chr(0x4E01)}喜{chr(0x4E01)}", "modern"))
    return pairs


def _han(s: str) -> str:
    return "".join(c for c in s if c not in "，、；：！？。")


def test_validation_never_overlaps_training() -> None:
    stats = CleanStats()
    classical = [Pair("山高月小", "水落石出", "classical")]
    train, val = split(_modern_pairs(), classical, val_size=20, seed=7, stats=stats)
    assert len(val) == 20
    val_lines = {_han(p.upper) for p in val} | {_han(p.lower) for p in val}
    for p in train:
        assert _han(p.upper) not in val_lines and _han(p.lower) not in val_lines, p
    assert len({_han(p.upper) for p in val}) == len(val)  # one reference per upper line
    assert classical[0] in train
    assert stats.dropped["modern:overlaps_validation"] >= len(val)  # the punctuated twins


def test_split_is_fixed_by_the_seed() -> None:
    a = split(_modern_pairs(), [], 20, 7, CleanStats())
    b = split(_modern_pairs(), [], 20, 7, CleanStats())
    c = split(_modern_pairs(), [], 20, 8, CleanStats())
    assert a == b
    assert a[1] != c[1]


def test_prepare_writes_disjoint_splits_and_stats(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "couplets").mkdir(parents=True)
    (data / "safety").mkdir()
    (data / "safety" / "blocklist.txt").write_text("赌场\n", encoding="utf-8")
    rows = ["upper\tlower\tsource"]
    rows += [f"{p.upper}\t{p.lower}\tsynthetic" for p in _modern_pairs()]
    rows += ["春来赌场开\t花开喜临门\tsynthetic", "长长长\t短短\tsynthetic"]
    (data / "couplets" / "modern.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = prepare(data, out, val_size=10, seed=1)
    train, val = read_pairs(out / "train.tsv"), read_pairs(out / "val.tsv")
    assert len(val) == 10
    assert not ({p.upper for p in train} & {p.upper for p in val})
    assert stats.dropped["modern:blocklisted"] == 1
    assert stats.dropped["modern:length_mismatch"] == 1
    saved = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert saved["kept"]["val:modern"] == 10
    assert saved["kept"]["train:modern"] == len(train)


def test_prepare_names_a_wrong_data_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="modern.tsv"):
        prepare(tmp_path, tmp_path / "out")
