"""``chunlian distill``: the quality mode's answers for training upper lines, as training data
(``training/distill.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


def cmd_distill(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from chunlian.data.corpus import read_pairs
    from chunlian.offline import OfflineGenerator
    from chunlian.training.distill import (
        DISTILLED,
        build_data_dir,
        read_distilled,
        run_teacher,
        sample_uppers,
    )

    data, out = Path(args.data), Path(args.out)
    for name in ("train.tsv", "val.tsv"):
        if not (data / name).is_file():
            print(f"chunlian: --data {data} has no {name} (expected the output of 'chunlian data')", file=sys.stderr)
            return 2
    if out.resolve() == data.resolve():
        print(f"chunlian: --out {out} is the --data directory (its training split would be overwritten)", file=sys.stderr)
        return 2
    if args.threads < 0:
        print(f"chunlian: --threads must be 0 (torch's default) or more, got {args.threads}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DISTILLED
    done = read_distilled(path)
    sample = sample_uppers(read_pairs(data / "train.tsv"), args.limit, args.seed)
    todo = [p for p in sample if p.upper not in done]
    t0 = time.perf_counter()
    if todo:
        teacher = OfflineGenerator.load_quality(args.device, capacity=args.batch_size)
        with tqdm(total=len(sample), initial=len(sample) - len(todo), desc="distill", unit="line",
                  disable=args.quiet) as bar:
            run_teacher(teacher, todo, path, chunk=args.batch_size, on_chunk=bar.update)
    stats: dict[str, Any] = build_data_dir(data, out, read_distilled(path), args.copies)
    stats["teacher_seconds_this_run"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(stats, ensure_ascii=False))
    return 0


def register(sub: Any) -> None:
    from chunlian.training.distill import DEFAULT_SEED

    d = sub.add_parser("distill", help="the quality mode's 下联 for training upper lines, as training data")
    d.add_argument("--data", default="runs/data", help="output of 'chunlian data' (its val.tsv is copied, never distilled)")
    d.add_argument("--out", default="runs/distill", help="data directory for 'chunlian train --data'")
    d.add_argument("--limit", type=_positive, default=15000, help="distinct modern upper lines to distill")
    d.add_argument("--seed", type=int, default=DEFAULT_SEED, help="of the sample of upper lines")
    d.add_argument("--batch-size", type=_positive, default=64, help="upper lines searched together")
    d.add_argument("--copies", type=_positive, default=1,
                   help="each distilled pair this many times in train.tsv (weighs the teacher up; default 1)")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    d.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_distill)
