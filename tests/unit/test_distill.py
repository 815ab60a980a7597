"""The distillation set: its sample (training 上联s only, the same order for every shard and
resume), the teacher's answers written and resumed, and the trainer reading them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from chunlian.data.corpus import read_rows
from chunlian.training.batches import Buckets
from chunlian.training.distill import (
    DISTILLED,
    Shard,
    distill,
    nearest,
    overlap,
    read_distilled,
    sample_uppers,
    upper_key,
)
from chunlian.training.train import TrainConfig, train

TRAIN = [("春回大地千山秀", "福满人间万户春", "wb14123"), ("天增岁月人增寿", "春满乾坤福满门", "modern"),
         ("一帆风顺年年好", "万事如意步步高", "modern"), ("花开富贵", "竹报平安", "classical"),
         ("山清水秀风光好", "人寿年丰喜事多", "wb14123"), ("国泰民安", "家和业兴", "modern"),
         ("五湖四海皆春色", "万水千山尽得辉", "modern"), ("春回大地千山秀", "日照神州万里明", "modern")]  # the same 上联 twice: sampled once
VAL = [("国泰民安", "人寿年丰")]  # this 上联 is also a validation pair's: never sampled


def _data(tmp: Path) -> Path:
    d = tmp / "data"
    d.mkdir()
    head = "upper\tlower\tregister\tsource\n"
    (d / "train.tsv").write_text(head + "".join(f"{u}\t{lo}\tmodern\t{s}\n" for u, lo, s in TRAIN), encoding="utf-8")
    (d / "val.tsv").write_text(head + "".join(f"{u}\t{lo}\tmodern\tmodern\n" for u, lo in VAL), encoding="utf-8")
    return d


def test_the_sample_is_distinct_training_uppers_never_validation_ones_in_a_fixed_order(tmp_path: Path) -> None:
    d = _data(tmp_path)
    every = sample_uppers(d, 100, seed=3)
    uppers = [p.upper for p in every]
    assert sorted(uppers) == sorted({u for u, _, _ in TRAIN} - {u for u, _ in VAL})
    assert [p.upper for p in sample_uppers(d, 3, seed=3)] == uppers[:3]  # a larger count extends it
    assert [p.upper for p in sample_uppers(d, 100, seed=4)] != uppers  # the seed sets the order
    assert {p.source for p in sample_uppers(d, 100, 0, ("wb14123",))} == {"wb14123"}
    with pytest.raises(ValueError, match="no pairs of nothing"):
        sample_uppers(d, 100, 0, ("nothing",))
    (d / "val.tsv").unlink()
    with pytest.raises(ValueError, match="no validation split"):
        sample_uppers(d, 100, 0)


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_is_refused_naming_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="k/n"):
        Shard.parse(text)


def test_shards_split_the_sample_and_a_second_run_goes_on_after_the_rows_on_disk(tmp_path: Path) -> None:
    d, out = _data(tmp_path), tmp_path / "distill"
    first = distill(d, out, 2, Shard(0, 2), chunk=1, progress=False)  # 1 of the first 2
    assert first["rows"] == 1 and first["preset"]["width"] == 32 and "@rev-" in first["search_weights"]
    with (out / "distilled-0of2.tsv").open("a", encoding="utf-8") as f:
        f.write("0123456789abcdef\tmod")  # a row a killed run left half written: cut
    again = distill(d, out, 5, Shard(0, 2), chunk=2, progress=False)  # the same line, then 2 more
    other = distill(d, out, 5, Shard(1, 2), chunk=2, progress=False)
    assert (again["rows"], other["rows"]) == (3, 2)
    rows = {k: read_rows(out / f"distilled-{k}of2.tsv") for k in (0, 1)}
    sample = sample_uppers(d, 5, 0)
    keys = [upper_key(p.upper) for p in sample]
    assert [r["key"] for r in rows[0]] == keys[0::2] and [r["key"] for r in rows[1]] == keys[1::2]
    by_key = {upper_key(p.upper): p for p in sample}
    for r in rows[0] + rows[1]:
        p = by_key[r["key"]]
        assert r.keys() == {"key", "register", "best", "nearest"} and p.upper not in r.values()  # no corpus text
        assert r["register"] == p.register
        assert len(r["best"]) == len(r["nearest"]) == len(p.upper)
        # the nearest line is chosen from n-best lines that include the best one
        assert overlap(r["nearest"], p.lower) >= overlap(r["best"], p.lower)
    manifest = json.loads((out / "distilled-0of2.json").read_text(encoding="utf-8"))
    assert manifest["rows"] == 3 and manifest["shard"] == "0/2" and manifest["rescore_weights"]
    # another split goes on after what every shard holds: only the 6th line is new
    assert distill(d, out, 6, Shard(0, 1), chunk=4, progress=False)["rows"] == 1
    assert [r["key"] for r in read_rows(out / "distilled-0of1.tsv")] == [upper_key(sample_uppers(d, 6, 0)[5].upper)]
    for shard in (Shard(0, 1), Shard(2, 3)):  # one set, one sample, whichever shard asks
        with pytest.raises(ValueError, match="seed 0, this run has 1: give another --out-dir"):
            distill(d, out, 6, shard, seed=1, progress=False)
    # the trainer finds each row's 上联 again and reads every shard as the source "distilled"
    pairs, left_out = read_distilled(out, d)
    assert left_out == 0 and len(pairs) == 6 and {p.source for p in pairs} == {DISTILLED}
    by_upper = {upper_key(p.upper): p for p in pairs}
    assert {(k, by_upper[k].lower) for k in keys} == {(r["key"], r["best"]) for r in rows[0] + rows[1]}
    near, _ = read_distilled(out, d, "nearest")
    assert {(upper_key(p.upper), p.lower) for p in near} >= {(r["key"], r["nearest"]) for r in rows[0] + rows[1]}
    assert Buckets(pairs, {DISTILLED: 1.0}, random.Random(0)).shares == {DISTILLED: 1.0}
    cfg = TrainConfig(data_dir=str(d), out_dir=str(tmp_path / "t"), export_path=str(tmp_path / "t" / "w.safetensors"),
                      max_steps=2, batch_pairs=4, warmup_steps=1, eval_every=2, ckpt_every=2, eval_pairs=1,
                      mix={DISTILLED: 0.5}, n_layer=1, n_head=2, d_model=16, d_ff=32, distilled=str(out))
    summary = train(cfg, progress=False)
    assert summary["steps"] == 2 and summary["distilled_rows_left_out"] == 0


def test_a_run_stops_after_the_chunk_that_ends_past_its_minutes(tmp_path: Path) -> None:
    d, out = _data(tmp_path), tmp_path / "distill"
    assert distill(d, out, 5, Shard(0, 1), chunk=2, minutes=1e-6, progress=False)["rows"] == 2
    assert distill(d, out, 5, Shard(0, 1), chunk=2, progress=False)["rows"] == 5
    with pytest.raises(ValueError, match="--minutes must be above 0"):
        distill(d, out, 5, Shard(0, 1), minutes=0, progress=False)
    with pytest.raises(ValueError, match="--beam-rows must hold one search of width 32, got 16"):
        distill(d, out, 5, Shard(0, 1), capacity=16, progress=False)


def test_rows_naming_no_training_upper_or_half_written_are_left_out_and_counted(tmp_path: Path) -> None:
    d, f = _data(tmp_path), tmp_path / "distilled-0of1.tsv"
    rows = [(upper_key("花开富贵"), "classical", "竹报平安", "竹报福安"),
            (upper_key("国泰民安"), "modern", "家和业兴", "家和业兴"),
            ("0123456789abcdef", "modern", "人寿年丰", "人寿年丰"), (upper_key("花开富贵"), "classical", "竹报平安", "竹报福安"),
            (upper_key("五湖四海皆春色"), "modern", "万水千山尽得辉", "万水千")]
    f.write_text("key\tregister\tbest\tnearest\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    pairs, left_out = read_distilled(f, d, "nearest")
    # 国泰民安 also opens a validation pair, the last row is half written, the same key twice is
    # one pair
    assert [(p.upper, p.lower, p.register) for p in pairs] == [("花开富贵", "竹报福安", "classical")] and left_out == 3
    best, left_out = read_distilled(f, d)
    assert [p.lower for p in best] == ["竹报平安", "万水千山尽得辉"] and left_out == 2
    with f.open("a", encoding="utf-8") as out:
        out.write(upper_key("山清水秀风光好") + "\tmodern\t人寿年")  # cut inside a column
    assert read_distilled(f, d) == (best, 3)
    f.write_text("key\tregister\tbest\tnearest\n0123456789abcdef\tmodern\t人寿年丰\t人寿年丰\n", encoding="utf-8")
    with pytest.raises(ValueError, match="names a training 上联"):
        read_distilled(f, d)
    f.write_text("upper\tlower\tregister\tsource\n花开富贵\t竹报平安\tmodern\tdistilled\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a distillation set: its columns are not key, register, best, nearest"):
        read_distilled(f, d)
    with pytest.raises(ValueError, match="no distillation set"):
        read_distilled(tmp_path / "nowhere", d)
    with pytest.raises(ValueError, match="one of best, nearest"):
        read_distilled(f, d, "top4")
    with pytest.raises(ValueError, match="distilled_target"):
        TrainConfig(data_dir="d", out_dir="o", export_path="w", distilled_target="worst")


def test_nearest_takes_the_nbest_line_sharing_most_with_the_gold_one_the_higher_ranked_on_a_tie() -> None:
    assert overlap("春满乾坤福满门", "春满人间福满门") == 5 + 3  # 春 满 满 福 门; 春满 福满 满门
    assert overlap("花开富贵", "竹报平安") == 0
    assert nearest("竹报平安", ["花开富贵", "竹报福安", "竹报平和"]) == "竹报平和"  # 3 + 2 against 3 + 1
    assert nearest("竹报平安", ["花开富贵", "草木春深"]) == "花开富贵"  # nothing shared: the best
    assert nearest("竹报平安", ["竹开富贵", "花报富贵"]) == "竹开富贵"
