"""Train the couplet model on the prepared corpora (CPU here, ``cuda`` when present).

Batches come from ``batches.Buckets``: one source and one line length a batch, each source at
its share (``mix``), no padding. The schedule runs over steps or over a budget of process CPU
time that a run can pause in and resume. Loss: 1.0 on 下联 characters and EOS, ``upper_weight`` on 上联
characters (the model also writes upper lines for 藏头 couplets), 0 on the forced SEP.
Checkpoints (model, optimiser, step, RNG) are written every ``ckpt_every`` steps and the
run resumes from the last one; an fp16 safetensors export is refreshed at each checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from chunlian.data.corpus import Pair, read_pairs
from chunlian.model.checkpoint import load_weights, save_weights
from chunlian.model.styles import derive_style
from chunlian.model.tokenizer import REVERSED_TOKEN, Tokenizer
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from chunlian.training.batches import REVERSED, Buckets, encode_batch, reversed_pairs
from chunlian.training.distill import TARGETS, read_distilled
from chunlian.training.ema import EmaWeights
from chunlian.training.warmstart import grown


@dataclass
class TrainConfig:
    data_dir: str = "runs/data"
    out_dir: str = "runs/train"
    export_path: str = "runs/train/latest.safetensors"
    max_steps: int = 2700  # the schedule's length when budget_cpu_s is 0
    # the schedule's length in process CPU seconds (all threads), carried across resumes; when
    # set, the cosine runs over CPU time and max_steps is not used: a budget means the same
    # amount of work on a busy and an idle host
    budget_cpu_s: float = 0.0
    # checkpoint and return once this much CPU time is spent (0: run to the end); a later run
    # with the same out_dir resumes where this one paused
    stop_cpu_s: float = 0.0
    batch_pairs: int = 128
    lr_max: float = 1.5e-3
    lr_min: float = 1e-4
    warmup_steps: int = 200
    weight_decay: float = 0.1
    # share of batches per source (a Source.name of data/corpus.py, or "reversed"); sources not
    # named share what is left in proportion to their size
    mix: dict[str, float] = field(default_factory=lambda: {"classical": 0.3})
    upper_weight: float = 0.5
    eval_every: int = 250
    ckpt_every: int = 250
    eval_pairs: int = 1000  # per validation split
    seed: int = 1234
    device: str = "cpu"
    # bf16 autocast: fast where the CPU has AMX/AVX-512 bf16 (or on cuda); emulated and
    # slow on an AVX2-only CPU
    bf16: bool = False
    # start from these exported weights (their ModelConfig, and their vocabulary unless
    # rebuild_vocab) with a fresh optimiser and schedule, instead of from random weights
    init_from: str | None = None
    # with init_from: a vocabulary built from the training data, keeping the trained rows of
    # the characters both share (training/warmstart.py)
    rebuild_vocab: bool = False
    # steps already behind the weights of init_from, for the version name
    step_offset: int = 0
    version_prefix: str = "step"
    # None: 6 / 6 / 192 / 768 from scratch; with init_from, its own (n_layer may grow)
    n_layer: int | None = None
    n_head: int | None = None
    d_model: int | None = None
    d_ff: int | None = None
    # on embeddings and residual branches (ModelConfig.dropout); None: the init_from
    # weights' own (a continuation keeps their regularisation), 0 from scratch
    dropout: float | None = None
    # also train on every modern pair the other way round (下联 as 上联), under its own
    # register token <r:reversed> and source "reversed" (give it a share in mix)
    augment_reverse: bool = False
    # exponential moving average of the weights (0: off), exported as ema.safetensors next
    # to the last and best weights; its validation loss is logged beside the model's
    ema_decay: float = 0.0
    # a distillation set (training/distill.py: a shard's file or a folder of shards), trained
    # on as the source "distilled" (give it a share in mix)
    distilled: str | None = None
    # which of a row's lines the student learns: the teacher's best, or its n-best line
    # nearest the gold one (distill.TARGETS)
    distilled_target: str = "best"

    def __post_init__(self) -> None:
        if self.distilled_target not in TARGETS:
            raise ValueError(f"distilled_target is one of {', '.join(TARGETS)}, got {self.distilled_target!r}")
        if self.budget_cpu_s < 0 or self.stop_cpu_s < 0:
            raise ValueError("budget_cpu_s and stop_cpu_s must be at least 0")
        bad = {k: v for k, v in self.mix.items() if not 0.0 <= v <= 1.0}
        if bad or sum(self.mix.values()) > 1.0 + 1e-9:
            raise ValueError(f"mix shares must lie in [0, 1] and sum to at most 1, got {self.mix}")


def weighted_loss(logits: Tensor, tgt: Tensor, weights: Tensor) -> Tensor:
    ce = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="none")
    return (ce * weights.flatten()).sum() / weights.sum().clamp_min(1.0)


def lr_at(step: int, cfg: TrainConfig, cpu_s: float = 0.0) -> float:
    """Linear warm-up over steps, then a cosine over the steps or the CPU budget."""
    if step < cfg.warmup_steps:
        return cfg.lr_max * (step + 1) / cfg.warmup_steps
    if cfg.budget_cpu_s > 0:
        frac = min(1.0, cpu_s / cfg.budget_cpu_s)
    else:
        frac = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr_min + 0.5 * (cfg.lr_max - cfg.lr_min) * (1 + math.cos(math.pi * frac))


class CpuClock:
    """Process CPU seconds (all threads) spent on a run, carried across resumes."""

    def __init__(self, carried_s: float = 0.0) -> None:
        self.carried_s = carried_s
        self.t0 = time.process_time()

    @property
    def cpu_s(self) -> float:
        return self.carried_s + time.process_time() - self.t0


@torch.no_grad()
def evaluate_loss(
    model: CoupletTransformer, tok: Tokenizer, val: list[Pair], cfg: TrainConfig
) -> float:
    """Mean 下联+EOS cross-entropy on ``val`` (upper weight 0: the served task)."""
    model.eval()
    by_len: dict[int, list[Pair]] = {}
    for p in val:
        by_len.setdefault(len(p.upper), []).append(p)
    tot, cnt = 0.0, 0.0
    for group in by_len.values():
        for i in range(0, len(group), 256):
            chunk = group[i : i + 256]
            styles = [derive_style(p.upper, p.lower, p.register) for p in chunk]
            idx, pos, role, tgt, w = encode_batch(tok, chunk, styles, 0.0, cfg.device)
            with torch.autocast(cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = model(idx, pos, role)
            ce = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="none")
            tot += float((ce * w.flatten()).sum())
            cnt += float(w.sum())
    model.train()
    return tot / max(cnt, 1.0)


def val_splits(data_dir: Path, eval_pairs: int, seed: int) -> dict[str, list[Pair]]:
    """{log key: sampled pairs} for each validation file present: ``val_loss`` for the modern
    split (``val.tsv``), ``val_loss_<source>`` for the others (``val_<source>.tsv``)."""
    out: dict[str, list[Pair]] = {}
    for path in sorted(data_dir.glob("val*.tsv")):
        pairs = read_pairs(path)
        key = "val_loss" if path.stem == "val" else f"val_loss_{path.stem.removeprefix('val_')}"
        out[key] = random.Random(seed).sample(pairs, min(eval_pairs, len(pairs)))
    if "val_loss" not in out:
        raise ValueError(f"no val.tsv in {data_dir}: run 'chunlian data' first")
    return out


def build_model(
    cfg: TrainConfig, forward_pairs: list[Pair], state: dict[str, Any] | None
) -> tuple[CoupletTransformer, Tokenizer]:
    """The model to train: from a checkpoint, from init_from (possibly grown), or fresh."""
    extra = [REVERSED_TOKEN] if cfg.augment_reverse else []
    # a checkpoint holds the whole model: the init_from weights are read only to start one
    init = load_weights(Path(cfg.init_from), "cpu") if cfg.init_from and state is None else None
    if state is not None:
        tok = Tokenizer(state["vocab"])
        mcfg = ModelConfig(**state["model_cfg"])
        model = CoupletTransformer(mcfg)
    elif init is not None:
        if cfg.d_model not in (None, init.model.cfg.d_model) or cfg.n_head not in (None, init.model.cfg.n_head) \
                or cfg.d_ff not in (None, init.model.cfg.d_ff):
            raise ValueError("a warm start keeps the width of --init-from (d_model, n_head, d_ff); only n_layer can grow")
        dropout = init.model.cfg.dropout if cfg.dropout is None else cfg.dropout
        n_layer = cfg.n_layer or init.model.cfg.n_layer
        if cfg.rebuild_vocab or n_layer != init.model.cfg.n_layer:
            tok = (Tokenizer.build((p.upper + p.lower for p in forward_pairs), extra=extra)
                   if cfg.rebuild_vocab else init.tokenizer)
            model = grown(init.model, init.tokenizer, tok, n_layer, dropout)
        else:
            tok = init.tokenizer
            model = CoupletTransformer(replace(init.model.cfg, dropout=dropout))
            model.load_state_dict(init.model.state_dict())
    else:
        tok = Tokenizer.build((p.upper + p.lower for p in forward_pairs), extra=extra)
        model = CoupletTransformer(ModelConfig(
            len(tok), cfg.n_layer or 6, cfg.n_head or 6, cfg.d_model or 192, cfg.d_ff or 768,
            dropout=cfg.dropout or 0.0))
    if cfg.augment_reverse and not tok.has_register(REVERSED):
        raise ValueError("--augment-reverse needs a vocabulary with <r:reversed> (continue from weights "
                         "trained with it, or --rebuild-vocab)")
    return model.to(cfg.device), tok


def _optimizer(model: CoupletTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr_max, betas=(0.9, 0.95),
    )


class Trainer:
    """One training run: its data, model, optimiser and clock, restored from the checkpoint
    in ``out_dir`` when there is one."""

    def __init__(self, cfg: TrainConfig) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.out = cfg, Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        forward = read_pairs(Path(cfg.data_dir) / "train.tsv")  # the vocabulary counts each pair once
        self.train_pairs = forward + (reversed_pairs(forward) if cfg.augment_reverse else [])
        # distilled rows left out: naming no training 上联 of data_dir, or half written
        self.distilled_left_out = 0
        if cfg.distilled:
            distilled, self.distilled_left_out = read_distilled(Path(cfg.distilled), Path(cfg.data_dir),
                                                               cfg.distilled_target)
            self.train_pairs += distilled
        self.vals = val_splits(Path(cfg.data_dir), cfg.eval_pairs, cfg.seed)
        self.ckpt_path = self.out / "ckpt.pt"
        state = torch.load(self.ckpt_path, map_location="cpu", weights_only=False) \
            if self.ckpt_path.exists() else None
        self.model, self.tok = build_model(cfg, forward, state)
        self.opt = _optimizer(self.model, cfg)
        self.rng = random.Random(cfg.seed)
        self.step, wall_s, cpu_s = 0, 0.0, 0.0
        self.history: list[dict[str, Any]] = []
        self.ema = EmaWeights(self.model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        if state is not None:
            self._restore(state)
            wall_s, cpu_s = state["elapsed_s"], state.get("cpu_s", 0.0)
        self.buckets = Buckets(self.train_pairs, cfg.mix, self.rng)
        self.t0, self.clock = time.perf_counter() - wall_s, CpuClock(cpu_s)
        self.meta = {"train_cfg": json.dumps(asdict(cfg))}
        # the best mean validation loss so far: its weights are also kept as best.safetensors
        # (the last step is not always the best once the data has been seen many times)
        self.best_vl = min((float(h["val_mean"]) for h in self.history if "val_mean" in h), default=math.inf)

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.history = state["step"], state["history"]
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        if self.ema is not None and "ema" in state:
            self.ema.load_state_dict(state["ema"])

    @property
    def version(self) -> str:
        return f"{self.cfg.version_prefix}{self.cfg.step_offset + self.step}"

    def finished(self) -> bool:
        cfg = self.cfg
        return self.clock.cpu_s >= cfg.budget_cpu_s if cfg.budget_cpu_s else self.step >= cfg.max_steps

    def paused(self) -> bool:
        return bool(self.cfg.stop_cpu_s) and self.clock.cpu_s >= self.cfg.stop_cpu_s

    def train_step(self) -> float:
        cfg = self.cfg
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, cfg, self.clock.cpu_s)
        pairs, styles = self.buckets.sample(cfg.batch_pairs)
        idx, pos, role, tgt, w = encode_batch(self.tok, pairs, styles, cfg.upper_weight, cfg.device)
        with torch.autocast(cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = self.model(idx, pos, role)
        loss = weighted_loss(logits, tgt, w)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        return float(loss.item())

    def evaluate(self, loss_ema: float) -> dict[str, Any]:
        """Validation losses into the history; the best weights so far kept."""
        losses = {k: round(evaluate_loss(self.model, self.tok, v, self.cfg), 4) for k, v in self.vals.items()}
        mean = round(sum(losses.values()) / len(losses), 4)
        entry: dict[str, Any] = {"step": self.step, "train_loss_ema": round(loss_ema, 4), **losses,
                                 "val_mean": mean, "cpu_s": round(self.clock.cpu_s, 1),
                                 "elapsed_s": round(time.perf_counter() - self.t0, 1)}
        if self.ema is not None:
            with self.ema.swapped_in():
                entry["val_loss_weights_ema"] = round(
                    evaluate_loss(self.model, self.tok, self.vals["val_loss"], self.cfg), 4)
        self.history.append(entry)
        if mean < self.best_vl:
            self.best_vl = mean
            save_weights(self.out / "best.safetensors", self.model, self.tok, version=self.version,
                         extra={**self.meta, "val_loss": f"{mean:.4f}"})
        return entry

    def checkpoint(self) -> None:
        """The resumable state (written whole, then renamed) and the exported weights."""
        tmp = self.out / "ckpt.pt.tmp"
        torch.save(
            {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
             "history": self.history, "elapsed_s": time.perf_counter() - self.t0, "cpu_s": self.clock.cpu_s,
             "rng": self.rng.getstate(), "torch_rng": torch.get_rng_state(), "vocab": self.tok.itos,
             "model_cfg": asdict(self.model.cfg), "train_cfg": asdict(self.cfg),
             **({"ema": self.ema.state_dict()} if self.ema is not None else {})},
            tmp,
        )
        os.replace(tmp, self.ckpt_path)
        save_weights(Path(self.cfg.export_path), self.model, self.tok, version=self.version, extra=self.meta)
        if self.ema is not None:
            with self.ema.swapped_in():
                save_weights(self.out / "ema.safetensors", self.model, self.tok, version=f"{self.version}-ema",
                             extra={**self.meta, "ema_decay": str(self.cfg.ema_decay)})

    def summary(self) -> dict[str, object]:
        return {
            "status": "done" if self.finished() else "paused", "steps": self.step,
            "params": self.model.num_params(), "vocab": len(self.tok), "train_pairs": len(self.train_pairs),
            "shares": self.buckets.shares, "elapsed_s": round(time.perf_counter() - self.t0, 1),
            "cpu_s": round(self.clock.cpu_s, 1), "history": self.history,
            "torch_threads": torch.get_num_threads(), "device": self.cfg.device,
            **({"distilled_rows_left_out": self.distilled_left_out} if self.cfg.distilled else {}),
        }


def train(cfg: TrainConfig, progress: bool = True) -> dict[str, object]:
    """Train (or resume) and export; returns a summary with losses and timing."""
    from tqdm import tqdm

    t = Trainer(cfg)
    budget = cfg.budget_cpu_s
    bar = tqdm(total=int(budget) if budget else cfg.max_steps, initial=int(t.clock.cpu_s) if budget else t.step,
               disable=not progress, desc="train (cpu s)" if budget else "train", smoothing=0.05)
    t.model.train()
    loss_ema: float | None = None
    while not t.finished() and not t.paused():
        lv = t.train_step()
        loss_ema = lv if loss_ema is None else 0.98 * loss_ema + 0.02 * lv
        bar.update(int(t.clock.cpu_s) - bar.n if budget else 1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", lr=f"{lr_at(t.step, cfg, t.clock.cpu_s):.2e}", step=t.step)
        at_end = t.finished() or t.paused()
        if t.step % cfg.eval_every == 0 or at_end:
            bar.write(json.dumps(t.evaluate(loss_ema)))
        if t.step % cfg.ckpt_every == 0 or at_end:
            t.checkpoint()
    bar.close()
    summary = t.summary()
    (t.out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
