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
                classical_share=0.0, n_layer=1, n_head=2, d_model=16, d_ff=32)
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
    train(_cfg(tmp_path, "b", init_from=str(src), step_offset=4, max_steps=2, lr_max=0.0, lr_min=0.0,
               d_model=32), progress=False)  # the exported ModelConfig wins over these fields
    before, after = load_weights(src), load_weights(tmp_path / "b" / "w.safetensors")
    assert after.version == "step6" and after.model.cfg == before.model.cfg
    assert after.tokenizer.itos == before.tokenizer.itos
    for (name, a), (_, b) in zip(before.model.state_dict().items(), after.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


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


def test_reversed_pairs_are_modern_training_pairs_the_other_way_round() -> None:
    from chunlian.data.corpus import Pair
    from chunlian.training.train import reversed_pairs

    pairs = [Pair("春回大地", "福满人间", "modern"), Pair("白日依山尽", "黄河入海流", "classical")]
    assert reversed_pairs(pairs) == [Pair("福满人间", "春回大地", "modern")]  # classical kept one way
