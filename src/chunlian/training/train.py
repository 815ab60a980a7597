"""Train the couplet model on the prepared corpora (CPU here, ``cuda`` when present).

Batches are drawn from (register, line length) buckets, so a batch holds sequences of one
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from chunlian.data.corpus import Pair, read_pairs
from chunlian.model.checkpoint import load_weights, save_weights
from chunlian.model.styles import derive_style
from chunlian.model.tokenizer import REVERSED_TOKEN, Tokenizer, sequence_roles
from chunlian.model.transformer import CoupletTransformer, ModelConfig


@dataclass
class TrainConfig:
    data_dir: str = "runs/data"
    out_dir: str = "runs/train"
    export_path: str = "runs/train/latest.safetensors"
    max_steps: int = 2700
    batch_pairs: int = 128
    lr_max: float = 1.5e-3
    lr_min: float = 1e-4
    warmup_steps: int = 200
    weight_decay: float = 0.1
    classical_share: float = 0.3  # share of batches drawn from the classical register
    upper_weight: float = 0.5
    eval_every: int = 250
    ckpt_every: int = 250
    eval_pairs: int = 1000
    seed: int = 1234
    device: str = "cpu"
    # bf16 autocast: fast where the CPU has AMX/AVX-512 bf16 (or on cuda); emulated and
    # slow on an AVX2-only CPU (the first run's machine)
    bf16: bool = False
    # start from these exported weights (their vocabulary and ModelConfig) with a fresh
    # optimiser and schedule, instead of from a random initialisation
    init_from: str | None = None
    # steps already behind the weights of init_from, for the version name (stepN)
    step_offset: int = 0
    n_layer: int = 6
    n_head: int = 6
    d_model: int = 192
    d_ff: int = 768
    # on embeddings and residual branches (ModelConfig.dropout); None: the init_from
    # weights' own (a continuation keeps their regularisation), 0 from scratch
    dropout: float | None = None
    # also train on every modern pair the other way round (下联 as 上联), under its own
    # register token <r:reversed>, for reverse_share of the batches (taken from the modern
    # share): twice the distinct modern sequences (the 88k modern pairs are the limit)
    augment_reverse: bool = False
    reverse_share: float = 0.3
    # exponential moving average of the weights (0: off), exported as ema.safetensors next
    # to the last and best weights; its validation loss is logged beside the model's
    ema_decay: float = 0.0


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


REVERSED = "reversed"  # the register of reversed pairs (token <r:reversed>)


def reversed_pairs(pairs: list[Pair]) -> list[Pair]:
    """The modern pairs the other way round, in their own register (the characters are the
    same; validation pairs are never among them: they are not in the training split)."""
    return [Pair(upper=p.lower, lower=p.upper, register=REVERSED) for p in pairs
            if p.register == "modern" and p.lower != p.upper]


class EmaWeights:
    """An exponential moving average of a model's parameters (fp32, on the model's device):
    ``ema = decay * ema + (1 - decay) * param`` after each optimiser step. Buffers are not
    averaged (the model has none that learn)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.model, self.decay = model, decay
        self.shadow = {n: p.detach().clone().float() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in self.model.named_parameters():
            self.shadow[n].lerp_(p.detach().float(), 1.0 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        return self.shadow

    def load_state_dict(self, shadow: dict[str, Tensor]) -> None:
        self.shadow = {n: t.to(self.shadow[n].device) for n, t in shadow.items()}

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the model for the block (evaluate, export), then back."""
        saved = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.shadow[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.model.named_parameters():
                    p.copy_(saved[n])


def weighted_loss(logits: Tensor, tgt: Tensor, weights: Tensor) -> Tensor:
    ce = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="none")
    return (ce * weights.flatten()).sum() / weights.sum().clamp_min(1.0)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr_max * (step + 1) / cfg.warmup_steps
    frac = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr_min + 0.5 * (cfg.lr_max - cfg.lr_min) * (1 + math.cos(math.pi * frac))


class Buckets:
    """Pairs grouped by (register, length), sampled by weight; one bucket per batch."""

    def __init__(
        self, pairs: list[Pair], classical_share: float, rng: random.Random, reverse_share: float = 0.0
    ) -> None:
        self.rng = rng
        self.groups: dict[tuple[str, int], list[tuple[Pair, str]]] = {}
        for p in pairs:
            key = (p.register, len(p.upper))
            # a reversed pair's style comes from the forward pair (derive_style reads both lines)
            register = "modern" if p.register == REVERSED else p.register
            self.groups.setdefault(key, []).append((p, derive_style(p.upper, p.lower, register)))
        self.keys = sorted(self.groups)
        tot = {r: sum(len(g) for (rr, _), g in self.groups.items() if rr == r)
               for r in ("modern", "classical", REVERSED)}
        share = {"classical": classical_share if tot["classical"] else 0.0,
                 REVERSED: reverse_share if tot[REVERSED] else 0.0}
        share["modern"] = 1.0 - share["classical"] - share[REVERSED]
        if share["modern"] <= 0.0:
            raise ValueError(f"classical_share + reverse_share must be below 1, got {share}")
        self.weights = [share[r] * len(self.groups[(r, n)]) / max(1, tot[r]) for r, n in self.keys]

    def sample(self, batch_pairs: int) -> tuple[list[Pair], list[str]]:
        key = self.rng.choices(self.keys, weights=self.weights)[0]
        group = self.groups[key]
        # Long lines get fewer pairs per batch: keep tokens per batch roughly constant.
        n = key[1]
        k = min(len(group), max(16, batch_pairs * 7 // max(7, n)))
        picked = self.rng.sample(group, k)
        return [p for p, _ in picked], [s for _, s in picked]


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


def train(cfg: TrainConfig, progress: bool = True) -> dict[str, object]:
    """Train (or resume) and export; returns a summary with losses and timing."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_pairs = read_pairs(Path(cfg.data_dir) / "train.tsv")
    forward_pairs = train_pairs  # the vocabulary counts each pair once
    if cfg.augment_reverse:
        train_pairs = train_pairs + reversed_pairs(train_pairs)
    val_pairs = read_pairs(Path(cfg.data_dir) / "val.tsv")
    val_eval = random.Random(cfg.seed).sample(val_pairs, min(cfg.eval_pairs, len(val_pairs)))
    ckpt_path = out / "ckpt.pt"
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False) if ckpt_path.exists() else None
    init = load_weights(Path(cfg.init_from), "cpu") if cfg.init_from else None
    if state is not None:
        tok = Tokenizer(state["vocab"])
    elif init is not None:
        tok = init.tokenizer
    else:
        extra = [REVERSED_TOKEN] if cfg.augment_reverse else []
        tok = Tokenizer.build((p.upper + p.lower for p in forward_pairs), extra=extra)
    if cfg.augment_reverse and not tok.has_register(REVERSED):
        raise ValueError("--augment-reverse needs a vocabulary with <r:reversed> (continue from weights trained with it)")
    if init is not None:
        mcfg = init.model.cfg if cfg.dropout is None else replace(init.model.cfg, dropout=cfg.dropout)
    else:
        mcfg = ModelConfig(len(tok), cfg.n_layer, cfg.n_head, cfg.d_model, cfg.d_ff, dropout=cfg.dropout or 0.0)
    model = CoupletTransformer(mcfg).to(cfg.device)
    if init is not None and state is None:
        model.load_state_dict(init.model.state_dict())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr_max, betas=(0.9, 0.95),
    )
    rng = random.Random(cfg.seed)
    step, history, elapsed_s = 0, [], 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, history, elapsed_s = state["step"], state["history"], state["elapsed_s"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
    ema = EmaWeights(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    if ema is not None and state is not None and "ema" in state:
        ema.load_state_dict(state["ema"])
    buckets = Buckets(train_pairs, cfg.classical_share, rng,
                      cfg.reverse_share if cfg.augment_reverse else 0.0)
    model.train()
    t0 = time.perf_counter() - elapsed_s
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not progress, desc="train", smoothing=0.05)
    device_type = cfg.device.split(":")[0]

    def checkpoint() -> None:
        tmp = out / "ckpt.pt.tmp"
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
             "history": history, "elapsed_s": time.perf_counter() - t0, "rng": rng.getstate(),
             "torch_rng": torch.get_rng_state(), "vocab": tok.itos, "train_cfg": asdict(cfg),
             **({"ema": ema.state_dict()} if ema is not None else {})},
            tmp,
        )
        os.replace(tmp, ckpt_path)
        save_weights(Path(cfg.export_path), model, tok, version=f"step{cfg.step_offset + step}",
                     extra={"train_cfg": json.dumps(asdict(cfg))})
        if ema is not None:
            with ema.swapped_in():
                save_weights(out / "ema.safetensors", model, tok, version=f"step{cfg.step_offset + step}-ema",
                             extra={"train_cfg": json.dumps(asdict(cfg)), "ema_decay": str(cfg.ema_decay)})

    # the best validation loss so far: its weights are also kept as best.safetensors (the
    # last step is not always the best once the data has been seen many times)
    best_vl = min((float(h["val_loss"]) for h in history), default=math.inf)
    loss_ema = None
    while step < cfg.max_steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
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
        bar.update(1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", lr=f"{lr_at(step, cfg):.2e}")
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            vl = evaluate_loss(model, tok, val_eval, cfg)
            history.append({"step": step, "train_loss_ema": round(loss_ema, 4), "val_loss": round(vl, 4),
                            "elapsed_s": round(time.perf_counter() - t0, 1)})
            if ema is not None:
                with ema.swapped_in():
                    history[-1]["val_loss_weights_ema"] = round(evaluate_loss(model, tok, val_eval, cfg), 4)
            bar.write(json.dumps(history[-1]))
            if vl < best_vl:
                best_vl = vl
                save_weights(out / "best.safetensors", model, tok, version=f"step{cfg.step_offset + step}",
                             extra={"train_cfg": json.dumps(asdict(cfg)), "val_loss": f"{vl:.4f}"})
        if step % cfg.ckpt_every == 0 or step == cfg.max_steps:
            checkpoint()
    bar.close()
    summary = {
        "steps": step, "params": model.num_params(), "vocab": len(tok),
        "train_pairs": len(train_pairs), "val_pairs": len(val_pairs),
        "elapsed_s": round(time.perf_counter() - t0, 1), "history": history,
        "torch_threads": torch.get_num_threads(), "device": cfg.device,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
