"""The cleaning rules of the data pipeline, on small synthetic inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunlian.data.blocklist import Blocklist
from chunlian.data.corpus import (
    PINNED_SIZE,
    SOURCES,
    CleanStats,
    Pair,
    Source,
    ValSplit,
    clean,
    drop_reason,
    pair_hash,
    prepare,
    read_pairs,
    read_pins,
    split,
)

MODERN = Source("modern", "modern.tsv", "modern")
CLASSICAL = Source("classical", "classical_lvshi.tsv", "classical")


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


def test_scraped_sources_drop_lines_under_their_minimum() -> None:
    assert drop_reason("春来，福", "花开，喜", None, min_han_chars=4) == "too_short"  # 3 Han characters
    assert drop_reason("春来福到", "花开喜临", None, min_han_chars=4) is None
    assert {s.name: s.min_han_chars for s in SOURCES}["wb14123"] == 4


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


def test_clean_normalises_then_removes_duplicates_across_sources() -> None:
    stats = CleanStats()
    seen: set[tuple[str, str]] = set()
    modern = clean(
        [
            ("春来, 福到", "花开, 喜临"),  # ASCII comma and a space: normalised
            ("春来，福到", "花开，喜临"),  # the same pair once normalised
            ("天增岁月人增寿", "春满乾坤福满门"),
            ("天增岁月人增寿", "春满乾坤福满"),
        ],
        MODERN, None, stats, seen,
    )
    classical = clean([("天增岁月人增寿", "春满乾坤福满门"), ("山高月小", "水落石出")],
                      CLASSICAL, None, stats, seen)
    # a scraped copy without the comma is the same couplet: the first source keeps it
    scraped = clean([("春来福到", "花开喜临"), ("日暖风和", "山青水秀")],
                    Source("wb14123", "w.tsv", "modern", min_han_chars=4), None, stats, seen)
    assert modern == [Pair("春来，福到", "花开，喜临", "modern", "modern"),
                      Pair("天增岁月人增寿", "春满乾坤福满门", "modern", "modern")]
    assert classical == [Pair("山高月小", "水落石出", "classical", "classical")]
    assert scraped == [Pair("日暖风和", "山青水秀", "modern", "wb14123")]
    assert stats.read == {"modern": 4, "classical": 2, "wb14123": 2}
    assert stats.dropped == {
        "modern:duplicate": 1, "modern:length_mismatch": 1, "classical:duplicate": 1, "wb14123:duplicate": 1,
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


def _splits(seed_a: int = 7, seed_b: int = 11) -> tuple[ValSplit, ...]:
    return ValSplit("val.tsv", "modern", seed_a), ValSplit("val_other.tsv", "other", seed_b)


def _other_pairs() -> list[Pair]:
    out = []
    for i in range(40):
        a, b = chr(0x5000 + 2 * i), chr(0x5000 + 2 * i + 1)
        out.append(Pair(f"冬{a}雪{a}", f"夏{b}雨{b}", "modern", "other"))
    # a pair of this source sharing its upper line with a modern pair: a leak if either is held out
    out.append(Pair(f"春{chr(0x4E00)}福{chr(0x4E00)}", "秋实冬藏", "modern", "other"))
    return out


def test_validation_never_overlaps_training() -> None:
    stats = CleanStats()
    classical = [Pair("山高月小", "水落石出", "classical", "classical")]
    by_source = {"modern": _modern_pairs(), "classical": classical, "other": _other_pairs()}
    train, vals = split(by_source, stats, val_size=20, splits=_splits())
    assert sorted(vals) == ["val.tsv", "val_other.tsv"]
    assert {p.source for p in vals["val.tsv"]} == {"modern"}
    assert {p.source for p in vals["val_other.tsv"]} == {"other"}
    val_lines = {_han(line) for val in vals.values() for p in val for line in (p.upper, p.lower)}
    assert all(len(v) == 20 for v in vals.values())
    for p in train:
        assert _han(p.upper) not in val_lines and _han(p.lower) not in val_lines, p
    for val in vals.values():
        assert len({_han(p.upper) for p in val}) == len(val)  # one reference per upper line
    assert classical[0] in train
    assert stats.dropped["modern:overlaps_validation"] >= 20  # the punctuated twins
    assert stats.dropped["other:overlaps_validation"] >= 1


def test_split_is_fixed_by_the_seed() -> None:
    by_source = {"modern": _modern_pairs(), "other": _other_pairs()}
    a = split(by_source, CleanStats(), 20, _splits())
    b = split(by_source, CleanStats(), 20, _splits())
    c = split(by_source, CleanStats(), 20, _splits(seed_b=12))
    assert a == b
    assert a[1]["val.tsv"] == c[1]["val.tsv"] and a[1]["val_other.tsv"] != c[1]["val_other.tsv"]


def test_prepare_writes_disjoint_splits_and_stats(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "couplets").mkdir(parents=True)
    rows = ["upper\tlower\tsource"]
    rows += [f"{p.upper}\t{p.lower}\tsynthetic" for p in _modern_pairs()]
    rows += ["春来赌场开\t花开喜临门\tsynthetic", "长长长\t短短\tsynthetic"]
    (data / "couplets" / "modern.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    wb = ["upper\tlower"] + [f"{p.upper}\t{p.lower}" for p in _other_pairs()]
    wb += ["赌场开门迎客\t花开喜临门庭", "春来，福\t花开，喜"]  # blocklisted; too short
    (data / "couplets" / "wb14123_train.tsv").write_text("\n".join(wb) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = prepare(data, out, val_size=10, blocklist=Blocklist({"赌场"}))
    train = read_pairs(out / "train.tsv")
    val, val_wb = read_pairs(out / "val.tsv"), read_pairs(out / "val_wb14123.tsv")
    assert len(val) == len(val_wb) == 10
    assert {p.source for p in val_wb} == {"wb14123"}
    held = {p.upper for p in val + val_wb}
    assert not ({p.upper for p in train} & held)
    assert {p.source for p in train} == {"modern", "wb14123"}
    assert stats.dropped["modern:blocklisted"] == 1
    assert stats.dropped["modern:length_mismatch"] == 1
    assert stats.dropped["wb14123:blocklisted"] == 1
    assert stats.dropped["wb14123:too_short"] == 1
    saved = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert saved["kept"]["val:modern:val.tsv"] == 10
    assert saved["kept"]["val:wb14123:val_wb14123.tsv"] == 10
    assert saved["kept"]["train:modern"] + saved["kept"]["train:wb14123"] == len(train)
    table = stats.table().splitlines()
    assert table[0].split()[:4] == ["source", "read", "train", "val"]
    assert table[2].split()[:4] == ["wb14123", str(len(wb) - 1), str(saved["kept"]["train:wb14123"]), "10"]


def test_prepare_names_a_wrong_data_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="modern.tsv"):
        prepare(tmp_path, tmp_path / "out")


def test_pinned_splits_hold_their_pairs_whatever_else_the_pool_holds() -> None:
    by_source = {"modern": _modern_pairs(), "other": _other_pairs()}
    _, carved = split(by_source, CleanStats(), 20, _splits())
    pins = {f: [pair_hash(p) for p in v] for f, v in carved.items()}
    # pairs a looser filter lets through: a new pool, and one that shares a pinned 上联
    shared = Pair(carved["val.tsv"][0].upper, "另有下联在此", "modern", "modern")
    extra = [Pair(f"新来{i}号联", f"又到{i}号门", "modern", "modern") for i in range(30)]
    grown = {"modern": extra + by_source["modern"] + [shared], "other": by_source["other"]}
    stats = CleanStats()
    train, vals = split(grown, stats, 20, _splits(), pins)
    assert vals == carved
    assert shared not in train and stats.dropped["modern:overlaps_validation"] >= 1
    with pytest.raises(ValueError, match="pinned validation pairs"):
        split({"modern": extra, "other": by_source["other"]}, CleanStats(), 20, _splits(), pins)


def test_the_shipped_pins_are_two_splits_of_two_thousand() -> None:
    pins = read_pins()
    assert {f: len(h) for f, h in pins.items()} == {"val.tsv": PINNED_SIZE, "val_wb14123.tsv": PINNED_SIZE}
