"""Training on a toy corpus: export, resume from a checkpoint, continue from exported weights,
dropout and the best step's export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chunlian.model.checkpoint import load_weights
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from chunlian.training.train import TrainConfig, train

PAIRS = [("春回大地", "福满人间"), ("天增岁月", "人满乾坤"), ("一帆风顺", "万事如意"),
         ("花开富贵", "竹报平安"), ("山清水秀", "人寿年丰"), ("国泰民安", "家和业兴")]


def _data(tmp: Path) -> Path:
    d = tmp / "data"
    d.mkdir()
    rows = [f"{u}\t{lo}\tmodern\n" for u, lo in PAIRS]
    (d / "train.tsv").write_text("upper\tlower\tregister\n" + "".join(rows[2:]), encoding="utf-8")
    (d / "val.tsv").write_text("upper\tlower\tregister\n" + "".join(rows[:2]), encoding="utf-8")
    return d


def _cfg(tmp: Path, name: str, **kw: object) -> TrainConfig:
    torch.set_num_threads(1)
    base = dict(data_dir=str(tmp / "data"), out_dir=str(tmp / name), export_path=str(tmp / name / "w.safetensors"),
                max_steps=4, batch_pairs=4, warmup_steps=1, eval_every=2, ckpt_every=2, eval_pairs=2,
                mix={}, n_layer=1, n_head=2, d_model=16, d_ff=32)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_train_exports_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    _data(tmp_path)
    first = train(_cfg(tmp_path, "a"), progress=False)
    assert first["steps"] == 4 and [h["step"] for h in first["history"]] == [2, 4]
    assert load_weights(tmp_path / "a" / "w.safetensors").version == "step4"
    again = train(_cfg(tmp_path, "a", max_steps=6), progress=False)  # same out dir: resumes
    assert [h["step"] for h in again["history"]] == [2, 4, 6]
    assert load_weights(tmp_path / "a" / "w.safetensors").version == "step6"


def test_init_from_starts_at_the_exported_weights(tmp_path: Path) -> None:
    _data(tmp_path)
    train(_cfg(tmp_path, "a"), progress=False)
    src = tmp_path / "a" / "w.safetensors"
    # a learning rate of zero leaves the weights where they started: at the export, not random
    train(_cfg(tmp_path, "b", init_from=str(src), step_offset=4, max_steps=2, lr_max=0.0, lr_min=0.0),
          progress=False)
    before, after = load_weights(src), load_weights(tmp_path / "b" / "w.safetensors")
    assert after.version == "step6" and after.model.cfg == before.model.cfg
    assert after.tokenizer.itos == before.tokenizer.itos
    for (name, a), (_, b) in zip(before.model.state_dict().items(), after.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # a warm start keeps the width of its weights: another one is refused, not silently ignored
    with pytest.raises(ValueError, match="width"):
        train(_cfg(tmp_path, "c", init_from=str(src), d_model=32), progress=False)


def test_a_grown_model_computes_what_the_trained_one_did(tmp_path: Path) -> None:
    from chunlian.model.tokenizer import Tokenizer
    from chunlian.training.warmstart import grown

    torch.manual_seed(0)
    old_tok = Tokenizer.build(["春回大地福满人间"], min_count=1)
    new_tok = Tokenizer.build(["春回大地福满人间天增岁月"], min_count=1)  # more characters, other ids
    old = CoupletTransformer(ModelConfig(len(old_tok), n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    new = grown(old, old_tok, new_tok, n_layer=4, dropout=0.0).eval()
    assert new.cfg.n_layer == 4 and new.cfg.vocab_size == len(new_tok)
    text = "春回大地"
    ids_old, ids_new = torch.tensor([old_tok.encode(text)]), torch.tensor([new_tok.encode(text)])
    pos, role = torch.arange(4)[None], torch.zeros(1, 4, dtype=torch.long)
    shared = [new_tok.stoi[c] for c in old_tok.itos]
    with torch.no_grad():
        a = old(ids_old, pos, role)
        b = new(ids_new, pos, role)[..., shared]  # the shared tokens' logits, in the old order
    assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="cannot drop layers"):
        grown(old, old_tok, new_tok, n_layer=1, dropout=0.0)


def test_a_cpu_budget_pauses_and_resumes_to_the_same_end(tmp_path: Path) -> None:
    _data(tmp_path)
    paused = train(_cfg(tmp_path, "t", budget_cpu_s=4.0, stop_cpu_s=1.0), progress=False)
    assert paused["status"] == "paused" and 1.0 <= paused["cpu_s"] < 4.0  # type: ignore[operator]
    done = train(_cfg(tmp_path, "t", budget_cpu_s=4.0), progress=False)
    assert done["status"] == "done" and done["cpu_s"] >= 4.0  # type: ignore[operator]
    assert done["steps"] > paused["steps"]  # type: ignore[operator]
    steps = [h["step"] for h in done["history"]]  # type: ignore[attr-defined]
    assert steps == sorted(steps) and paused["steps"] in steps  # one history across the pause
    with pytest.raises(ValueError, match="at least 0"):
        TrainConfig(budget_cpu_s=-1.0)


def test_source_shares_split_what_is_left_by_size() -> None:
    from chunlian.training.batches import source_shares

    shares = source_shares({"modern": 0.4}, {"modern": 10, "wb14123": 300, "classical": 100})
    assert shares["modern"] == 0.4
    assert shares["wb14123"] == pytest.approx(0.45) and shares["classical"] == pytest.approx(0.15)
    assert source_shares({"modern": 0.2, "classical": 0.2}, {"modern": 1, "classical": 1}) == {
        "modern": 0.5, "classical": 0.5}  # nothing unnamed: the named ones scale up
    with pytest.raises(ValueError, match="does not hold: wb14123"):
        source_shares({"wb14123": 0.5}, {"modern": 10})
    with pytest.raises(ValueError, match="sum to at most 1"):
        TrainConfig(mix={"modern": 0.7, "classical": 0.5})


def test_dropout_trains_with_noise_and_infers_without_and_the_best_step_is_kept(tmp_path: Path) -> None:
    _data(tmp_path)
    summary = train(_cfg(tmp_path, "d", dropout=0.3), progress=False)
    best = load_weights(tmp_path / "d" / "best.safetensors")
    losses = {f"step{h['step']}": h["val_loss"] for h in summary["history"]}  # type: ignore[attr-defined]
    assert best.version == min(losses, key=losses.__getitem__)
    assert best.model.cfg.dropout == 0.3  # saved with the config; inert at inference
    model = CoupletTransformer(ModelConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, d_ff=32, dropout=0.5))
    idx = torch.tensor([[1, 2, 3, 4]])
    pos, role = torch.arange(4)[None], torch.zeros_like(idx)
    model.train()
    assert not torch.equal(model(idx, pos, role), model(idx, pos, role))
    model.eval()
    assert torch.equal(model(idx, pos, role), model(idx, pos, role))
    with pytest.raises(ValueError, match="dropout"):
        ModelConfig(vocab_size=40, dropout=1.0)
    assert json.loads(json.dumps(best.model.cfg.to_dict()))["dropout"] == 0.3


def test_train_refuses_a_dropout_outside_0_to_1(capsys: pytest.CaptureFixture[str]) -> None:
    from chunlian.cli import main

    assert main(["train", "--dropout", "1.5"]) == 2
    assert "--dropout must be in [0, 1), got 1.5" in capsys.readouterr().err
    assert main(["train", "--mix", "modern=0.8,classical=0.4"]) == 2
    assert "sum to at most 1" in capsys.readouterr().err
    assert main(["train", "--mix", "modern:0.3"]) == 2
    assert "--mix wants source=share pairs" in capsys.readouterr().err
    assert main(["train", "--ema-decay", "1.0"]) == 2
    assert "--ema-decay must be in [0, 1)" in capsys.readouterr().err


def test_reversed_pairs_are_modern_training_pairs_the_other_way_round() -> None:
    from chunlian.data.corpus import Pair
    from chunlian.training.batches import reversed_pairs

    pairs = [Pair("春回大地", "福满人间", "modern"), Pair("白日依山尽", "黄河入海流", "classical")]
    # in their own register (token <r:reversed>); classical pairs are kept one way
    assert reversed_pairs(pairs) == [Pair("福满人间", "春回大地", "reversed", "reversed")]


def test_buckets_draw_each_source_at_its_share() -> None:
    import random

    from chunlian.data.corpus import Pair
    from chunlian.training.batches import Buckets, reversed_pairs

    modern = [Pair(u, lo, "modern") for u, lo in PAIRS]
    classical = [Pair("白日依山尽", "黄河入海流", "classical", "classical")]
    mix = {"reversed": 0.3, "classical": 0.2}
    buckets = Buckets(modern + reversed_pairs(modern) + classical, mix, random.Random(0))
    drawn = [buckets.sample(4)[0][0].source for _ in range(4000)]
    shares = {r: drawn.count(r) / len(drawn) for r in ("modern", "reversed", "classical")}
    assert abs(shares["modern"] - 0.5) < 0.04 and abs(shares["reversed"] - 0.3) < 0.04
    assert abs(shares["classical"] - 0.2) < 0.04
    # a reversed pair's style is the forward pair's
    styles = {p.upper: s for key in buckets.keys for p, s in buckets.groups[key]}
    assert styles["竹报平安"] == styles["花开富贵"]
    with pytest.raises(ValueError, match="does not hold: wb14123"):
        Buckets(modern, {"wb14123": 0.5}, random.Random(0))


def test_augment_reverse_adds_the_register_token_after_the_characters_and_ema_is_exported(
    tmp_path: Path,
) -> None:
    _data(tmp_path)
    plain = train(_cfg(tmp_path, "p"), progress=False)
    summary = train(_cfg(tmp_path, "r", augment_reverse=True, ema_decay=0.5), progress=False)
    assert summary["vocab"] == plain["vocab"] + 1  # counts are of the forward pairs only
    w = load_weights(tmp_path / "r" / "w.safetensors")
    assert w.tokenizer.itos[-1] == "<r:reversed>"
    assert w.tokenizer.itos[:-1] == load_weights(tmp_path / "p" / "w.safetensors").tokenizer.itos
    rid = w.tokenizer.stoi["<r:reversed>"]
    first_char = w.tokenizer.itos[w.tokenizer.n_special]
    assert w.tokenizer.decode([rid, w.tokenizer.n_special]) == first_char
    ema = load_weights(tmp_path / "r" / "ema.safetensors")
    assert ema.version == "step4-ema" and ema.tokenizer.itos == w.tokenizer.itos
    # the average lags the weights: it differs from them, and its loss is logged beside theirs
    differs = [not torch.equal(a, b) for a, b in zip(w.model.state_dict().values(),
                                                     ema.model.state_dict().values(), strict=True)]
    assert any(differs)
    assert all("val_loss_weights_ema" in h for h in summary["history"])  # type: ignore[attr-defined]
    # resuming restores the average from the checkpoint (not a fresh copy of the weights)
    again = train(_cfg(tmp_path, "r", augment_reverse=True, ema_decay=0.5, max_steps=6), progress=False)
    assert [h["step"] for h in again["history"]] == [2, 4, 6]  # type: ignore[attr-defined]
    assert load_weights(tmp_path / "r" / "ema.safetensors").version == "step6-ema"


def test_augment_reverse_from_weights_without_the_register_token_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from chunlian.cli import main

    _data(tmp_path)
    train(_cfg(tmp_path, "a"), progress=False)
    code = main(["train", "--data", str(tmp_path / "data"), "--out-dir", str(tmp_path / "b"), "--no-progress",
                 "--export", str(tmp_path / "b" / "w.safetensors"), "--max-steps", "2", "--augment-reverse",
                 "--init-from", str(tmp_path / "a" / "w.safetensors")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "<r:reversed>" in err


def test_ema_average_follows_its_formula() -> None:
    from chunlian.training.ema import EmaWeights

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = EmaWeights(model, 0.75)
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update()  # 0.75 * 1 + 0.25 * 3
    assert torch.allclose(ema.shadow["weight"], torch.full((1, 2), 1.5))
    with ema.swapped_in():
        assert torch.allclose(model.weight, torch.full((1, 2), 1.5))
    assert torch.allclose(model.weight, torch.full((1, 2), 3.0))
    with pytest.raises(ValueError, match="ema_decay"):
        EmaWeights(model, 1.0)


def test_eval_reports_each_length_bucket_apart() -> None:
    from chunlian.training.eval_run import by_length

    uppers = ["春回大地", "天增岁月人增寿", "一元复始万象更新", "春风得意花千树，喜气盈门福满堂"]
    refs = ["福满人间", "春满乾坤福满门", "九州同春百业兴旺", "瑞雪丰年玉万枝，和风入户春盈院"]
    hyps = [refs[0], "春满乾坤喜满门", "五谷丰登六畜兴旺", "秋月当空水一池，清辉照夜月当头"]
    out = by_length(uppers, hyps, refs)
    assert list(out) == ["<=7", "8-12", ">12"]
    assert [out[k]["pairs"] for k in out] == [2, 1, 1]
    assert out["<=7"]["bleu1"] > out[">12"]["bleu1"]  # one exact line among the short ones
    assert by_length(uppers[:1], hyps[:1], refs[:1]).keys() == {"<=7"}  # empty buckets are left out
