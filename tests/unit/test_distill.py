"""The distillation set: its sample (training 上联s only, the same order for every shard and
resume), the teacher's answers written and resumed, and the trainer reading them."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from chunlian.training.batches import Buckets
from chunlian.training.distill import (
    DISTILLED,
    NBEST_SEP,
    TOP_K,
    Shard,
    distill,
    nearest,
    overlap,
    read_distilled,
    sample_uppers,
)
from chunlian.training.train import TrainConfig, train

TRAIN = [("春回大地千山秀", "福满人间万户春", "wb14123"), ("天增岁月人增寿", "春满乾坤福满门", "modern"),
         ("一帆风顺年年好", "万事如意步步高", "modern"), ("花开富贵", "竹报平安", "classical"),
         ("山清水秀风光好", "人寿年丰喜事多", "wb14123"), ("国泰民安", "家和业兴", "modern"),
         ("春回大地千山秀", "日照神州万里明", "modern")]  # the same 上联 twice: sampled once
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
    again = distill(d, out, 5, Shard(0, 2), chunk=2, progress=False)  # the same line, then 2 more
    other = distill(d, out, 5, Shard(1, 2), chunk=2, progress=False)
    assert (again["rows"], other["rows"]) == (3, 2)
    rows = {k: list(csv.DictReader((out / f"distilled-{k}of2.tsv").open(encoding="utf-8"), delimiter="\t"))
            for k in (0, 1)}
    sample = [p.upper for p in sample_uppers(d, 5, 0)]
    assert [r["upper"] for r in rows[0]] == sample[0::2] and [r["upper"] for r in rows[1]] == sample[1::2]
    gold = {u: lo for u, lo, _ in TRAIN[:-1]}
    for r in rows[0] + rows[1]:
        assert len(r["lower"]) == len(r["upper"]) and r["source"] == DISTILLED
        nbest = r["nbest"].split(NBEST_SEP)  # the reranked search's lines, best first
        assert r["gold"] == gold[r["upper"]] and nbest[0] == r["lower"] and len(set(nbest)) == len(nbest) > 1
    manifest = json.loads((out / "distilled-0of2.json").read_text(encoding="utf-8"))
    assert manifest["rows"] == 3 and manifest["shard"] == "0/2" and manifest["rescore_weights"]
    # the trainer reads every shard as the source "distilled", which a mix can weigh
    pairs = read_distilled(out)
    assert len(pairs) == 5 and {p.source for p in pairs} == {DISTILLED}
    near = read_distilled(out, "nearest")
    assert [p.upper for p in near] == [p.upper for p in pairs]
    for p, r in zip(near, rows[0] + rows[1], strict=True):
        assert p.lower == nearest(r["gold"], r["nbest"].split(NBEST_SEP))
    # top4: each row's best lines in rank order, a pair each
    top = read_distilled(out, f"top{TOP_K}")
    want = [(r["upper"], line) for r in rows[0] + rows[1] for line in r["nbest"].split(NBEST_SEP)[:TOP_K]]
    assert [(p.upper, p.lower) for p in top] == want and len(top) > len(pairs)
    assert Buckets(pairs, {DISTILLED: 1.0}, random.Random(0)).shares == {DISTILLED: 1.0}
    cfg = TrainConfig(data_dir=str(d), out_dir=str(tmp_path / "t"), export_path=str(tmp_path / "t" / "w.safetensors"),
                      max_steps=2, batch_pairs=4, warmup_steps=1, eval_every=2, ckpt_every=2, eval_pairs=1,
                      mix={DISTILLED: 0.5}, n_layer=1, n_head=2, d_model=16, d_ff=32, distilled=str(out))
    assert train(cfg, progress=False)["steps"] == 2
    with pytest.raises(ValueError, match="no distillation set"):
        read_distilled(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="one of best, nearest, top4"):
        read_distilled(out, "worst")


def test_nearest_takes_the_nbest_line_sharing_most_with_the_gold_one_the_higher_ranked_on_a_tie() -> None:
    assert overlap("春满乾坤福满门", "春满人间福满门") == 5 + 3  # 春 满 满 福 门; 春满 福满 满门
    assert overlap("花开富贵", "竹报平安") == 0
    assert nearest("竹报平安", ["花开富贵", "竹报福安", "竹报平和"]) == "竹报平和"  # 3 + 2 against 3 + 1
    assert nearest("竹报平安", ["花开富贵", "草木春深"]) == "花开富贵"  # nothing shared: the best
    assert nearest("竹报平安", ["竹开富贵", "花报富贵"]) == "竹开富贵"


def test_a_set_without_the_nbest_columns_is_read_for_its_best_lines_only(tmp_path: Path) -> None:
    f = tmp_path / "distilled-0of1.tsv"
    f.write_text("upper\tlower\tregister\tsource\n花开富贵\t竹报平安\tmodern\tdistilled\n", encoding="utf-8")
    assert [p.lower for p in read_distilled(f)] == ["竹报平安"]
    for target in ("nearest", "top4"):
        with pytest.raises(ValueError, match="no gold and n-best columns"):
            read_distilled(f, target)
    with pytest.raises(ValueError, match="distilled_target"):
        TrainConfig(data_dir="d", out_dir="o", export_path="w", distilled_target="worst")
