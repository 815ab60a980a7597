"""benchmarks/litserve_peer.py: both sides get the same model processes, threads and rows,
and the rounds add up (LitServe itself is not needed here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from chunlian.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("litserve_peer", ROOT / "benchmarks" / "litserve_peer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peer = _load()


def test_defaults_are_chunlians_own_layout() -> None:
    served = load_settings(device="cpu")
    args = peer.parse_args([])
    assert args.workers == served.resolved_engine_replicas()
    assert args.threads == served.resolved_replica_threads(args.workers)
    assert args.rows == served.max_batch_size // args.workers
    assert args.max_wait_ms == served.max_wait_ms
    assert args.concurrency == [64, 256]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        peer.parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        peer.parse_args(["--concurrency", "64", "0"])


def test_summary_averages_rates_and_sums_counts_and_errors() -> None:
    rounds = [
        {"requests_per_s": 100.0, "p99_ms": 900.0, "requests": 2000, "errors": {"504": 2}},
        {"requests_per_s": 80.0, "p99_ms": 1100.0, "requests": 1600, "errors": {"504": 1, "500": 4}},
    ]
    out = peer.summary(rounds)
    assert out["requests_per_s"] == 90.0
    assert out["p99_ms"] == 1000.0
    assert out["requests"] == 3600
    assert out["errors"] == {"504": 3, "500": 4}
    assert out["requests_per_s_by_round"] == [100.0, 80.0]
    assert peer.ratio(90.0, 60.0) == 1.5
    assert peer.ratio(None, 60.0) is None
