"""``chunlian data``, ``chunlian distill`` and ``chunlian train``: the corpora prepared, the
quality mode's answers written for distillation, the model trained."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from chunlian.cliargs import add_device, add_no_progress, dump, fail, hidden_alias
from chunlian.training.distill import TARGETS


def cmd_data(args: argparse.Namespace) -> int:
    from chunlian.data.corpus import prepare

    if args.val_size < 1:
        return fail(f"--val-size must be at least 1, got {args.val_size}")
    try:
        stats = prepare(Path(args.data_dir), Path(args.out_dir), args.val_size)
    except FileNotFoundError as e:
        return fail(str(e))
    print(stats.table(), file=sys.stderr)
    dump(stats.as_dict())
    return 0


def parse_mix(text: str) -> dict[str, float]:
    """``source=share,...`` -> {source: share}; ValueError naming the bad part."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = (x.strip() for x in part.partition("="))
        try:
            mix[name] = float(value)
        except ValueError:
            name = ""
        if not name:
            raise ValueError(f"--mix wants source=share pairs such as modern=0.3,classical=0.15; got {part!r}")
    return mix


def cmd_train(args: argparse.Namespace) -> int:
    from chunlian.model.device import resolve_device
    from chunlian.training.train import TrainConfig, train

    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        return fail(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.ema_decay is not None and not 0.0 <= args.ema_decay < 1.0:
        return fail(f"--ema-decay must be in [0, 1) (0: off), got {args.ema_decay}")
    given: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("bf16", "init_from", "step_offset", "lr_max", "warmup_steps", "batch_pairs", "dropout",
                     "augment_reverse", "ema_decay", "rebuild_vocab", "n_layer", "n_head", "d_model", "d_ff",
                     "version_prefix", "max_steps", "distilled", "distilled_target")
        if getattr(args, name) is not None  # given on the command line (0 included)
    }
    try:
        if args.mix is not None:
            given["mix"] = parse_mix(args.mix)
        cfg = TrainConfig(
            data_dir=args.data, out_dir=args.out_dir, export_path=args.export, device=resolve_device(args.device),
            budget_cpu_s=60.0 * (args.budget_cpu_min or 0.0), stop_cpu_s=60.0 * (args.stop_after_cpu_min or 0.0),
            **given,
        )
    except ValueError as e:
        return fail(str(e))
    try:
        summary = train(cfg, progress=not args.no_progress)
    except ValueError as e:  # a configuration the data or the --init-from weights cannot take
        return fail(str(e))
    dump({k: v for k, v in summary.items() if k != "history"})
    return 0


def register_data(sub: Any) -> None:
    """Add ``chunlian data``."""
    d = sub.add_parser("data", help="prepare the training data (clean, dedupe, split)")
    d.add_argument("--data-dir", required=True, help="folder holding couplets/ (the safety filter is the package's audited list)")
    d.add_argument("--out-dir", default="runs/data", help="where the splits go (default runs/data)")
    hidden_alias(d, "--out", "out_dir")
    d.add_argument("--val-size", type=int, default=2000,
                   help="pairs in each validation split (modern, wb14123); at 2000 the pinned splits, at any other size new ones carved with fixed seeds (default 2000)")
    d.set_defaults(fn=cmd_data)


def register_train(sub: Any) -> None:
    """Add ``chunlian train``."""
    t = sub.add_parser("train", help="train (or resume) the couplet model")
    t.add_argument("--data", default="runs/data", help="output of 'chunlian data' (default runs/data)")
    t.add_argument("--out-dir", default="runs/train", help="checkpoints and logs (default runs/train)")
    hidden_alias(t, "--out", "out_dir")
    t.add_argument("--export", default="runs/train/latest.safetensors", help="the exported weights file")
    t.add_argument("--max-steps", type=int, default=None, help="the schedule's length in steps when no --budget-cpu-min is given (default 2700)")
    add_device(t, "training")
    t.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast (CPUs with AMX or AVX-512 bf16, cuda)")
    t.add_argument("--init-from", default=None, help="continue from exported weights (.safetensors)")
    t.add_argument("--step-offset", type=int, default=None, help="steps behind --init-from (version name)")
    t.add_argument("--lr-max", type=float, default=None, help="peak learning rate")
    t.add_argument("--warmup-steps", type=int, default=None, help="steps of learning-rate warm-up")
    t.add_argument("--batch-pairs", type=int, default=None, help="pairs a step")
    t.add_argument("--dropout", type=float, default=None, help="on embeddings and residual branches (default: 0 from scratch, the --init-from weights' own when continuing)")
    t.add_argument("--augment-reverse", action="store_true", default=None,
                   help="also train on every modern pair the other way round (register <r:reversed>)")
    t.add_argument("--mix", default=None,
                   help="share of batches per source, e.g. modern=0.3,wb14123=0.47,classical=0.15"
                        " (sources: modern, classical, more_modern, wb14123, reversed, distilled); the sources"
                        " not named share the rest by size (default classical=0.3)")
    t.add_argument("--budget-cpu-min", type=float, default=None,
                   help="the schedule's length in process CPU minutes (all threads) instead of steps:"
                        " the cosine runs over it and it ends the run")
    t.add_argument("--stop-after-cpu-min", type=float, default=None,
                   help="checkpoint and stop once this many CPU minutes are spent; run again to resume")
    t.add_argument("--rebuild-vocab", action="store_true", default=None,
                   help="with --init-from: a vocabulary from the training data, keeping the trained"
                        " rows of shared characters")
    t.add_argument("--n-layer", type=int, default=None,
                   help="layers (default 6; with --init-from its own, and more layers grow the model)")
    t.add_argument("--n-head", type=int, default=None, help="attention heads (default 6)")
    t.add_argument("--d-model", type=int, default=None, help="width (default 192)")
    t.add_argument("--d-ff", type=int, default=None, help="feed-forward width (default 768)")
    t.add_argument("--version-prefix", default=None,
                   help="the exported version is this plus the step count (default 'step')")
    t.add_argument("--ema-decay", type=float, default=None,
                   help="also keep an exponential moving average of the weights (e.g. 0.999): ema.safetensors")
    t.add_argument("--distilled", default=None,
                   help="also train on a distillation set (chunlian distill: a folder of shards such as"
                        " data/distilled, or one shard's file) as the source 'distilled' (give it a share in"
                        " --mix); its rows name their 上联s in --data's train.tsv")
    t.add_argument("--distilled-target", choices=TARGETS, default=None,
                   help="what a distilled row teaches: the quality mode's best line (default), or its"
                        " n-best line nearest the gold 下联 (sequence-level interpolation)")
    add_no_progress(t, old_quiet=True)
    t.set_defaults(fn=cmd_train)


def cmd_distill(args: argparse.Namespace) -> int:
    from chunlian.model.device import resolve_device
    from chunlian.training.distill import Shard, distill

    try:
        shard = Shard.parse(args.shard)
        sources = tuple(filter(None, (x.strip() for x in args.sources.split(","))))
        manifest = distill(Path(args.data), Path(args.out_dir), args.count, shard, seed=args.seed,
                           chunk=args.chunk, sources=sources, device=resolve_device(args.device), progress=not args.no_progress,
                           minutes=args.minutes, capacity=args.beam_rows)
    except ValueError as e:
        return fail(str(e))
    dump(manifest)
    return 0


def register_distill(sub: Any) -> None:
    """Add ``chunlian distill``."""
    d = sub.add_parser("distill", help="write the quality mode's answers for training lines (a distillation set)")
    d.add_argument("--data", default="runs/data", help="output of 'chunlian data' (default runs/data)")
    d.add_argument("--out-dir", default="runs/distill",
                   help="where the shards go (default runs/distill; data/distilled is the set kept with the"
                        " code, which a run there goes on adding to)")
    d.add_argument("--count", type=int, required=True, help="training 上联s in the whole set (all shards)")
    d.add_argument("--shard", default="0/1",
                   help="k/n: this process writes every n-th line from the k-th (one process a core; default 0/1)")
    d.add_argument("--sources", default="",
                   help="comma-separated sources to sample 上联s from, e.g. modern,more_modern,wb14123 (default: all)")
    d.add_argument("--seed", type=int, default=0, help="the sample's seed (the same for every shard; default 0)")
    d.add_argument("--chunk", type=int, default=64, help="lines written (and resumable) at a time (default 64)")
    d.add_argument("--beam-rows", type=int, default=64,
                   help="the teacher's row pool, 32 rows a search at a time (default 64: the fastest on one"
                        " CPU core; a GPU wants thousands, with --chunk as large)")
    d.add_argument("--minutes", type=float, default=None,
                   help="stop after the chunk that ends past this many minutes (default: when the shard is done)")
    add_device(d, "the quality mode")
    add_no_progress(d)
    d.set_defaults(fn=cmd_distill)
