"""``chunlian bench engine | service | http | sweep | compare``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from chunlian.bench import http
from chunlian.cliargs import add_device, hidden_alias, positive


def _engine(args: argparse.Namespace) -> int:
    from chunlian.bench.engine import compare_weights, run
    from chunlian.config import load_settings

    if args.against:
        report = compare_weights([args.model_path, *args.against], args.max_batch_size, args.requests,
                                 args.sequential_requests, args.torch_threads,
                                 load_settings(device=args.device).resolved_device(), args.rounds)
        print(json.dumps(report, ensure_ascii=False, indent=None if args.json else 1))
        return 0
    sweep = [int(x) for x in args.sweep.split(",")] if args.sweep else None
    settings = load_settings(device=args.device, max_batch_size=args.max_batch_size,
                             engine_replicas=args.engine_replicas)
    replicas = settings.resolved_engine_replicas()  # 0: as the service's auto setting gives here
    report = run(args.model_path, args.max_batch_size, args.requests, args.sequential_requests,
                 args.torch_threads, sweep, settings.resolved_device(), args.rounds, replicas)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        for k, v in report.items():
            print(f"{k:34s} {v}")
    return 0


def _service(args: argparse.Namespace) -> int:
    from chunlian.bench.service import format_report, run_service_bench

    report = run_service_bench(duration_s=args.duration, hit_concurrency=args.hit_concurrency,
                               miss_concurrency=args.miss_concurrency,
                               max_batch_size=args.max_batch_size, progress=not args.json,
                               rounds=args.rounds, engine_replicas=args.engine_replicas)
    if args.out:
        Path(args.out).write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
    return 0


def _add_engine(bsub: Any) -> None:
    e = bsub.add_parser("engine", help="sequential vs static vs continuous batching, offline")
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.add_argument("--model-path", type=Path, default=None, help="weights (default: the shipped ones)")
    add_device(e)
    e.add_argument("--max-batch-size", type=positive(int), default=128, help="rows of the batch (default 128)")
    e.add_argument("--requests", type=positive(int), default=800, help="requests of the batched runs (default 800)")
    e.add_argument("--sequential-requests", type=positive(int), default=100,
                   help="requests of the one-at-a-time run (default 100)")
    e.add_argument("--torch-threads", type=positive(int), default=2, help="torch threads (default 2)")
    hidden_alias(e, "--threads", "torch_threads", type=positive(int))
    e.add_argument("--sweep", default="", help="also a table by max_batch_size, e.g. 1,8,32,128")
    e.add_argument("--engine-replicas", type=int, default=0,
                   help="also continuous batching on this many single-engine processes side by side, "
                        "the service's layout (default 0: as CHUNLIAN_ENGINE_REPLICAS=0 gives here; 1: off)")
    hidden_alias(e, "--replicas", "engine_replicas", type=int)
    e.add_argument("--rounds", type=positive(int), default=2,
                   help="static and continuous runs each, alternating order; figures are means (default 2)")
    e.add_argument("--against", type=Path, action="append", default=None, metavar="WEIGHTS",
                   help="instead of the batching modes: these weights side by side with --model-path,"
                        " continuous batching at --max-batch-size (couplets/s) and one request at a"
                        " time (latency), alternating order each round (repeatable)")
    e.set_defaults(fn=_engine)


def _add_service(bsub: Any) -> None:
    v = bsub.add_parser("service", help="cache hits vs a bare FastAPI endpoint; misses vs the engine's peak")
    v.add_argument("--json", action="store_true", help="print JSON instead of a table")
    v.add_argument("--duration-s", dest="duration", type=float, default=15.0,
                   help="seconds per HTTP phase, over all rounds (default 15)")
    hidden_alias(v, "--duration", "duration", type=float)
    v.add_argument("--rounds", type=positive(int), default=2,
                   help="every phase this many times, alternating the order; figures are means (default 2)")
    v.add_argument("--hit-concurrency", type=int, default=64, help="clients of the cache-hit phase (default 64)")
    v.add_argument("--miss-concurrency", type=int, default=64, help="clients of the cache-miss phase (default 64)")
    v.add_argument("--max-batch-size", type=int, default=64, help="the service's max_batch_size (default 64)")
    v.add_argument("--engine-replicas", type=int, default=0,
                   help="engine processes to serve with (default 0: the service's auto, one per core)")
    v.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    v.set_defaults(fn=_service)


def register(sub: Any) -> None:
    """Add ``chunlian bench`` and its sub-commands."""
    bench = sub.add_parser("bench", help="benchmarks (ratios measured side by side)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    _add_engine(bsub)
    _add_service(bsub)
    http.register(bsub)
