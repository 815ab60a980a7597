"""Train the couplet model on the prepared corpora (CPU here, ``cuda`` when present).

Batches are drawn from (source, line length) buckets, each source at its share of the
batches (``mix``), so a batch holds sequences of one
length and needs no padding. Loss: 1.0 on 下联 characters and EOS, ``upper_weight`` on 上联
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
from chunlian.model.tokenizer import REVERSED_TOKEN, Tokenizer, sequence_roles
from chunlian.model.transformer import CoupletTransformer, ModelConfig
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

    def __post_init__(self) -> None:
        if self.budget_cpu_s < 0 or self.stop_cpu_s < 0:
            raise ValueError("budget_cpu_s and stop_cpu_s must be at least 0")
        bad = {k: v for k, v in self.mix.items() if not 0.0 <= v <= 1.0}
        if bad or sum(self.mix.values()) > 1.0 + 1e-9:
            raise ValueError(f"mix shares must lie in [0, 1] and sum to at most 1, got {self.mix}")


def encode_batch(
    tok: Tokenizer, pairs: list[Pair], styles: list[str], upper_weight: float, device: str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Same-length pairs -> (idx, pos, role, targets, weights), each ``[B, 2n+4]``."""
    n = len(pairs[0].upper)
    rows = []
    for p, s in zip(pairs, styles, strict=True):
        rows.append(
            tok.prefix(s, p.register) + tok.encode(p.upper) + [tok.sep_id] + tok.encode(p.lower)
            + [tok.eos_id]
        )
    seq = torch.tensor(rows, dtype=torch.long)  # [B, 2n+5]
    idx, tgt = seq[:, :-1], seq[:, 1:]
    T = idx.shape[1]
    pos = torch.arange(T).expand_as(idx)
    role = torch.tensor(sequence_roles(n, n)).expand_as(idx)
    w = torch.zeros(T)
    w[2 : 2 + n] = upper_weight  # targets u_0..u_{n-1}
    w[3 + n :] = 1.0  # targets l_0..l_{n-1}, EOS
    weights = w.expand_as(idx).clone()
    weights[tgt == tok.unk_id] = 0.0
    return idx.to(device), pos.to(device), role.to(device), tgt.to(device), weights.to(device)


REVERSED = "reversed"  # the register and source of reversed pairs (token <r:reversed>)


def reversed_pairs(pairs: list[Pair]) -> list[Pair]:
    """The modern-register pairs the other way round, in their own register (validation
    pairs are never among them: they are not in the training split)."""
    return [Pair(upper=p.lower, lower=p.upper, register=REVERSED, source=REVERSED) for p in pairs
            if p.register == "modern" and p.lower != p.upper]


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


def source_shares(mix: dict[str, float], sizes: dict[str, int]) -> dict[str, float]:
    """The share of batches of each source present: the named ones as given, the rest of
    1.0 split among the unnamed ones by size (or the named ones scaled up if none is left)."""
    absent = sorted(s for s, v in mix.items() if v > 0 and not sizes.get(s))
    if absent:
        raise ValueError(f"--mix names sources the training data does not hold: {', '.join(absent)}"
                         f" (it holds {', '.join(sorted(sizes))})")
    named = {s: v for s, v in mix.items() if sizes.get(s)}
    others = {s: n for s, n in sizes.items() if s not in named and n}
    rest = max(0.0, 1.0 - sum(named.values()))
    shares = dict(named)
    total_others = sum(others.values())
    for s, n in others.items():
        shares[s] = rest * n / total_others
    if not others:
        scale = sum(named.values())
        if scale <= 0:
            raise ValueError(f"--mix gives every source a share of 0: {mix}")
        shares = {s: v / scale for s, v in named.items()}
    return shares


class Buckets:
    """Pairs grouped by (source, length), sampled by weight; one bucket per batch."""

    def __init__(self, pairs: list[Pair], mix: dict[str, float], rng: random.Random) -> None:
        self.rng = rng
        self.groups: dict[tuple[str, int], list[tuple[Pair, str]]] = {}
        for p in pairs:
            # a reversed pair's style comes from the forward pair (derive_style reads both lines)
            register = "modern" if p.register == REVERSED else p.register
            self.groups.setdefault((p.source, len(p.upper)), []).append(
                (p, derive_style(p.upper, p.lower, register)))
        self.keys = sorted(self.groups)
        sizes: dict[str, int] = {}
        for (src, _), g in self.groups.items():
            sizes[src] = sizes.get(src, 0) + len(g)
        self.shares = source_shares(mix, sizes)
        self.weights = [self.shares[s] * len(self.groups[(s, n)]) / sizes[s] for s, n in self.keys]

    def sample(self, batch_pairs: int) -> tuple[list[Pair], list[str]]:
        key = self.rng.choices(self.keys, weights=self.weights)[0]
        group = self.groups[key]
        # Long lines get fewer pairs per batch: keep tokens per batch roughly constant.
        n = key[1]
        k = min(len(group), max(16, batch_pairs * 7 // max(7, n)))
        picked = self.rng.sample(group, k)
        return [p for p, _ in picked], [s for _, s in picked]


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
    init = load_weights(Path(cfg.init_from), "cpu") if cfg.init_from else None
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


def train(cfg: TrainConfig, progress: bool = True) -> dict[str, object]:
    """Train (or resume) and export; returns a summary with losses and timing."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    forward_pairs = read_pairs(Path(cfg.data_dir) / "train.tsv")  # the vocabulary counts each pair once
    train_pairs = forward_pairs + (reversed_pairs(forward_pairs) if cfg.augment_reverse else [])
    vals = val_splits(Path(cfg.data_dir), cfg.eval_pairs, cfg.seed)
    ckpt_path = out / "ckpt.pt"
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False) if ckpt_path.exists() else None
    model, tok = build_model(cfg, forward_pairs, state)
    opt = _optimizer(model, cfg)
    rng = random.Random(cfg.seed)
    step, history, wall_s, carried_cpu_s = 0, [], 0.0, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, history, wall_s = state["step"], state["history"], state["elapsed_s"]
        carried_cpu_s = state.get("cpu_s", 0.0)
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
    ema = EmaWeights(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    if ema is not None and state is not None and "ema" in state:
        ema.load_state_dict(state["ema"])
    buckets = Buckets(train_pairs, cfg.mix, rng)
    model.train()
    t0, clock = time.perf_counter() - wall_s, CpuClock(carried_cpu_s)
    budget = cfg.budget_cpu_s
    bar = tqdm(total=int(budget) if budget else cfg.max_steps, initial=int(clock.cpu_s) if budget else step,
               disable=not progress, desc="train (cpu s)" if budget else "train", smoothing=0.05)
    device_type = cfg.device.split(":")[0]

    def version() -> str:
        return f"{cfg.version_prefix}{cfg.step_offset + step}"

    meta = {"train_cfg": json.dumps(asdict(cfg))}

    def checkpoint() -> None:
        tmp = out / "ckpt.pt.tmp"
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
             "history": history, "elapsed_s": time.perf_counter() - t0, "cpu_s": clock.cpu_s,
             "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "vocab": tok.itos,
             "model_cfg": asdict(model.cfg), "train_cfg": asdict(cfg),
             **({"ema": ema.state_dict()} if ema is not None else {})},
            tmp,
        )
        os.replace(tmp, ckpt_path)
        save_weights(Path(cfg.export_path), model, tok, version=version(), extra=meta)
        if ema is not None:
            with ema.swapped_in():
                save_weights(out / "ema.safetensors", model, tok, version=f"{version()}-ema",
                             extra={**meta, "ema_decay": str(cfg.ema_decay)})

    def finished() -> bool:
        return clock.cpu_s >= budget if budget else step >= cfg.max_steps

    def paused() -> bool:
        return bool(cfg.stop_cpu_s) and clock.cpu_s >= cfg.stop_cpu_s

    # the best mean validation loss so far: its weights are also kept as best.safetensors (the
    # last step is not always the best once the data has been seen many times)
    best_vl = min((float(h["val_mean"]) for h in history if "val_mean" in h), default=math.inf)
    loss_ema = None
    while not finished() and not paused():
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, clock.cpu_s)
        pairs, styles = buckets.sample(cfg.batch_pairs)
        idx, pos, role, tgt, w = encode_batch(tok, pairs, styles, cfg.upper_weight, cfg.device)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(idx, pos, role)
        loss = weighted_loss(logits, tgt, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ema is not None:
            ema.update()
        step += 1
        lv = loss.item()
        loss_ema = lv if loss_ema is None else 0.98 * loss_ema + 0.02 * lv
        bar.update(int(clock.cpu_s) - bar.n if budget else 1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", lr=f"{lr_at(step, cfg, clock.cpu_s):.2e}", step=step)
        at_end = finished() or paused()
        if step % cfg.eval_every == 0 or at_end:
            losses = {k: round(evaluate_loss(model, tok, v, cfg), 4) for k, v in vals.items()}
            mean = round(sum(losses.values()) / len(losses), 4)
            history.append({"step": step, "train_loss_ema": round(loss_ema, 4), **losses, "val_mean": mean,
                            "cpu_s": round(clock.cpu_s, 1), "elapsed_s": round(time.perf_counter() - t0, 1)})
            if ema is not None:
                with ema.swapped_in():
                    history[-1]["val_loss_weights_ema"] = round(evaluate_loss(model, tok, vals["val_loss"], cfg), 4)
            bar.write(json.dumps(history[-1]))
            if mean < best_vl:
                best_vl = mean
                save_weights(out / "best.safetensors", model, tok, version=version(),
                             extra={**meta, "val_loss": f"{mean:.4f}"})
        if step % cfg.ckpt_every == 0 or at_end:
            checkpoint()
    bar.close()
    summary: dict[str, object] = {
        "status": "done" if finished() else "paused", "steps": step, "params": model.num_params(),
        "vocab": len(tok), "train_pairs": len(train_pairs), "shares": buckets.shares,
        "elapsed_s": round(time.perf_counter() - t0, 1), "cpu_s": round(clock.cpu_s, 1), "history": history,
        "torch_threads": torch.get_num_threads(), "device": cfg.device,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
