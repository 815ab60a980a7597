"""``chunlian bench service`` folds its rounds into one figure per phase."""

from __future__ import annotations

import pytest

from chunlian.bench.service import _mean_phase, run_service_bench


def test_rounds_of_a_phase_are_averaged_their_errors_summed_and_kept() -> None:
    a = {"requests": 100, "requests_per_s": 10.0, "p50_ms": 4.0, "errors": {"429": 2},
         "mean_batch_size": None}
    b = {"requests": 300, "requests_per_s": 30.0, "p50_ms": 8.0, "errors": {"429": 1, "504": 3},
         "mean_batch_size": None}
    got = _mean_phase([a, b])
    assert got["requests"] == 400
    assert got["requests_per_s"] == 20.0 and got["p50_ms"] == 6.0
    assert got["errors"] == {"429": 3, "504": 3}
    assert got["mean_batch_size"] is None
    assert got["requests_per_s_by_round"] == [10.0, 30.0]


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        run_service_bench(rounds=0)
