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


def test_every_miss_is_seeded_and_the_offline_peaks_run_the_same_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The misses phase draws seeded requests only, in every round, so the offline peaks (some
    run before a round's misses) get the misses' mix exactly: a share of 1.0, not the greedy-
    first plan's growing share (0.2-0.34 at the peaks against 0.6 at the end on an Intel AMX host)."""
    from collections.abc import Iterator
    from contextlib import contextmanager
    from typing import Any

    from chunlian.bench import service
    from chunlian.bench.plan import RequestPlan

    class _Srv:
        url, pid = "http://127.0.0.1:9", 1

    @contextmanager
    def fake_bare() -> Iterator[tuple[str, int]]:
        yield "http://127.0.0.1:8", 2

    @contextmanager
    def fake_server(settings: Any) -> Iterator[_Srv]:
        yield _Srv()

    sent: dict[str, list[dict[str, Any]]] = {}
    shares: list[float] = []

    def fake_phase(url: str, pid: int | None, concurrency: int, duration_s: float, plan: RequestPlan,
                   label: str, progress: bool, warmup_s: float = 1.0) -> dict[str, Any]:
        # more than the built-in lines' greedy requests (400 lines x 4 styles) in each round
        sent.setdefault(label, []).extend(plan.next_body() for _ in range(2000))
        return {"requests": 2000, "requests_per_s": 100.0, "p50_ms": 5.0, "errors": {}, "mean_batch_size": 60.0}

    def fake_peak(max_batch_size: int, requests: int, threads: int, seeded_share: float = 0.0) -> dict[str, Any]:
        shares.append(seeded_share)
        return {"seq_per_s": 120.0, "steady_seq_per_s": 125.0}

    def fake_replicas_peak(max_batch_size: int, requests: int, replicas: int, threads: int,
                           seeded_share: float = 0.0) -> dict[str, Any]:
        shares.append(seeded_share)
        assert (replicas, threads) == (2, 1)
        return {"seq_per_s": 150.0, "steady_seq_per_s": 160.0}

    monkeypatch.setattr(service, "bare_server", fake_bare)
    monkeypatch.setattr(service, "run_server", fake_server)
    monkeypatch.setattr(service, "_warm_hits", lambda url, lines: None)
    monkeypatch.setattr(service, "_phase", fake_phase)
    monkeypatch.setattr(service, "engine_peak", fake_peak)
    monkeypatch.setattr(service, "replicas_peak", fake_replicas_peak)
    monkeypatch.setenv("CHUNLIAN_TORCH_THREADS", "1")
    out = run_service_bench(rounds=2, progress=False, engine_replicas=2)
    assert len(sent["misses"]) == 4000 and all("seed" in b for b in sent["misses"])
    assert len({(b["upper"], b["style"], b["seed"]) for b in sent["misses"]}) == 4000  # every one fresh
    assert not any("seed" in b for b in sent["hits"])  # the hits stay the hot greedy lines
    assert shares == [1.0] * 6 and out["misses_seeded_share"] == 1.0
    # the reference is the best offline layout: here the replicas' (served with 2 replicas)
    assert set(out["engine"]) == {"threads_1", "threads_2", "replicas_2"}
    assert out["meta"]["engine_replicas"] == 2
    assert out["ratio_miss_rps_vs_engine_peak"] == round(100.0 / 160.0, 3)
    monkeypatch.setattr(service, "replicas_peak", None)  # one engine: no replicas phase
    shares.clear()
    one = run_service_bench(rounds=1, progress=False, engine_replicas=1)
    assert shares == [1.0, 1.0] and set(one["engine"]) == {"threads_1", "threads_2"}
    assert one["ratio_miss_rps_vs_engine_peak"] == round(100.0 / 125.0, 3)
