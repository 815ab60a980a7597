"""``chunlian bench sweep`` and ``compare``: settings, tables, best point, outputs, CLI
wiring (the service and the load are stubbed; one test starts a service that must fail)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chunlian.bench import compare, sweep
from chunlian.cli import build_parser
from chunlian.cluster.procs import free_port


def test_server_env_drops_inherited_settings() -> None:
    base = {"PATH": "/bin", "CHUNLIAN_REDIS_URL": "redis://x", "chunlian_cache_size": "5"}
    env = sweep.server_env({"max_batch_size": 8, "cache_size": 0, "model_path": None}, base)
    assert env == {"PATH": "/bin", "CHUNLIAN_MAX_BATCH_SIZE": "8", "CHUNLIAN_CACHE_SIZE": "0"}


def test_run_server_reports_a_failed_start() -> None:
    with pytest.raises(RuntimeError, match="exited with 2"), sweep.run_server({"max_batch_size": 0}):
        pass


def _row(batch: int, wait: float, rps: float, p99: float | None, errors: int = 0) -> dict[str, Any]:
    return {"max_batch_size": batch, "max_wait_ms": wait, "requests_per_s": rps, "p50_ms": 1.0,
            "p95_ms": 2.0, "p99_ms": p99, "mean_batch_size": 1.5, "tokens_per_s": 10.0,
            "errors": errors, "error_rate": 0.0, "server_cpu_cores": 1.0, "queue_depth_mean": 0.0,
            "requests": 100}


def test_pick_best() -> None:
    rows = [_row(1, 0, 10, 900), _row(8, 0, 100, 300), _row(16, 0, 103, 250), _row(64, 0, 140, 1500),
            _row(32, 5, 120, 400, errors=3)]
    # 64 breaks the SLO, 32/5 had errors; 16 is within 5% of 8's... the top is 16 (103), 8 is close too
    best = sweep.pick_best(rows, slo_p99_ms=1000)
    assert best is not None and best["max_batch_size"] == 16
    assert sweep.pick_best(rows, slo_p99_ms=100)["max_batch_size"] == 64  # type: ignore[index]
    assert sweep.pick_best([], 1000) is None


def test_markdown_table_and_outputs(tmp_path: Path) -> None:
    rows = [{**_row(b, w, 10.0 * b, 100.0 + b), "report": {"x": 1}} for w in (0.0, 5.0) for b in (1, 8, 64)]
    md = sweep.markdown_table([{k: v for k, v in r.items() if k != "report"} for r in rows])
    assert md.count("\n") == 1 + len(rows) and "| 64 | 5 | 640 |" in md
    paths = sweep.write_outputs(rows, tmp_path / "out", {"title": "t", "concurrency": 8}, 1000.0,
                                plot_path=tmp_path / "docs" / "sweep.png")
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert len(doc["rows"]) == 6 and doc["best"]["max_batch_size"] == 64 and doc["best"]["max_wait_ms"] == 0.0
    assert "Best here: max_batch_size=64, max_wait_ms=0" in paths["md"].read_text(encoding="utf-8")


@dataclass
class _FakeServer:
    url: str = "http://127.0.0.1:9"
    pid: int = 0


class _FakeResult:
    def __init__(self, rep: dict[str, Any]) -> None:
        self.rep = rep

    def report(self) -> dict[str, Any]:
        return self.rep


def _rep(rps: float, **extra: Any) -> dict[str, Any]:
    base = {"requests_per_s": rps, "p50_ms": 5.0, "p95_ms": 9.0, "p99_ms": 10.0, "errors": {},
            "error_rate": 0.0, "requests": 10, "mean_batch_size": 2.0}
    return {**base, **extra}


def test_run_sweep_starts_one_cache_off_server_per_point(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Mapping[str, object]] = []

    @contextmanager
    def fake_server(settings: Mapping[str, object]) -> Iterator[_FakeServer]:
        started.append(dict(settings))
        yield _FakeServer()

    def fake_load(url: str, concurrency: int, duration: float, max_requests: int, plan: Any, **kw: Any) -> _FakeResult:
        assert kw["server_pid"] == 0 and kw["warmup_s"] == 0.5 and concurrency == 4 and duration == 1.0
        return _FakeResult(_rep(float(started[-1]["max_batch_size"])))  # type: ignore[arg-type]

    monkeypatch.setattr(sweep, "run_server", fake_server)
    monkeypatch.setattr(sweep, "run_load", fake_load)
    rows = sweep.run_sweep((1, 8), (0.0, 20.0), concurrency=4, duration_s=1.0, warmup_s=0.5,
                           extra_settings={"torch_threads": 2}, progress=False)
    # batch-size major, the waits reversed at every other batch size (drift must not look
    # like a wait effect); the rows come back ordered by wait, then batch size
    assert [(s["max_batch_size"], s["max_wait_ms"]) for s in started] == [(1, 0.0), (1, 20.0), (8, 20.0), (8, 0.0)]
    assert [(r["max_batch_size"], r["max_wait_ms"]) for r in rows] == [(1, 0.0), (8, 0.0), (1, 20.0), (8, 20.0)]
    assert all(s["cache_size"] == 0 and s["torch_threads"] == 2 for s in started)
    assert [r["requests_per_s"] for r in rows] == [1.0, 8.0, 1.0, 8.0]


def test_leading_points_and_mean_row() -> None:
    rows = [_row(8, 0, 100, 300), _row(16, 0, 150, 400), _row(64, 5, 170, 900), _row(128, 5, 200, 1500),
            _row(32, 5, 160, 500, errors=1)]
    # 128 breaks the SLO and 32/5 had errors: the pool is 8, 16 and 64/5, most requests/s first;
    # then those of the points with the most requests/s of all not yet in (the rule's fallback,
    # should the repeated rounds find no point inside the SLO): 128/5 (of 128/5, 64/5), and with
    # three, 128/5 and 32/5 (of 128/5, 64/5, 32/5)
    assert sweep.leading_points(rows, 1000, 2) == [(64, 5), (16, 0), (128, 5)]
    assert sweep.leading_points(rows, 1000, 3) == [(64, 5), (16, 0), (8, 0), (128, 5), (32, 5)]
    assert sweep.leading_points(rows, 2000, 2) == [(128, 5), (64, 5)]  # the same leaders either way
    assert sweep.leading_points(rows, 100, 1) == [(128, 5)]  # nothing inside the SLO: all of them
    runs = [_row(64, 5, 170, 900), _row(64, 5, 130, 1100, errors=2)]
    runs[1]["mean_batch_size"] = None
    m = sweep.mean_row(runs)
    assert (m["max_batch_size"], m["max_wait_ms"], m["requests_per_s"], m["p99_ms"]) == (64, 5, 150.0, 1000.0)
    assert m["errors"] == 2 and m["requests"] == 200 and m["mean_batch_size"] is None
    assert m["rounds"] == [{"requests_per_s": 170, "p99_ms": 900}, {"requests_per_s": 130, "p99_ms": 1100}]


def test_confirm_points_interleaves_the_rounds_and_the_confirmed_best_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The single pass put 64 first by drift; three interleaved rounds put 128 first."""
    started: list[tuple[int, float]] = []
    truth = {(64, 5.0): 150.0, (128, 5.0): 170.0}

    @contextmanager
    def fake_server(settings: Mapping[str, object]) -> Iterator[_FakeServer]:
        started.append((int(settings["max_batch_size"]), float(settings["max_wait_ms"])))  # type: ignore[call-overload]
        assert settings["cache_size"] == 0
        yield _FakeServer()

    def fake_load(url: str, concurrency: int, duration: float, max_requests: int, plan: Any, **kw: Any) -> _FakeResult:
        drift = 1.0 - 0.05 * len(started)  # the host slows down run after run
        return _FakeResult(_rep(truth[started[-1]] * drift, p99_ms=900.0))

    monkeypatch.setattr(sweep, "run_server", fake_server)
    monkeypatch.setattr(sweep, "run_load", fake_load)
    load = {"concurrency": 4, "duration_s": 1.0, "warmup_s": 0.0, "max_requests": 10, "unique_ratio": 1.0,
            "extra_settings": None, "progress": False}
    confirmed = sweep.confirm_points([(64, 5.0), (128, 5.0)], 3, **load)
    assert started == [(64, 5.0), (128, 5.0), (128, 5.0), (64, 5.0), (64, 5.0), (128, 5.0)]
    assert [len(r["rounds"]) for r in confirmed] == [3, 3]
    assert confirmed[1]["requests_per_s"] > confirmed[0]["requests_per_s"]
    single = [{**_row(64, 5.0, 160.0, 900.0), "report": {}}, {**_row(128, 5.0, 140.0, 900.0), "report": {}}]
    paths = sweep.write_outputs(single, tmp_path, {"title": "t"}, 1000.0, confirmed=confirmed)
    doc = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert doc["best"]["max_batch_size"] == 128 and doc["best_single_pass"]["max_batch_size"] == 64
    md = paths["md"].read_text(encoding="utf-8")
    assert "Best by the single pass: max_batch_size=64" in md
    assert "Best here (confirmed): max_batch_size=128" in md and "2 leading points measured again in 3" in md


# ---- compare ----------------------------------------------------------------------------------


def _runs() -> dict[str, dict[str, Any]]:
    return {
        "baseline_mixed": _rep(20.0, mean_ms=3000.0, mean_hit_ms=None, mean_miss_ms=3000.0, p99_ms=4000.0,
                               server_cpu_util=0.5, requests_per_cpu_s=20.0, cache_hit_ratio=None),
        "chunlian_mixed": _rep(400.0, mean_ms=150.0, mean_hit_ms=5.0, mean_miss_ms=200.0, p99_ms=400.0,
                               server_cpu_util=0.9, requests_per_cpu_s=222.0, cache_hit_ratio=0.28),
        "baseline_misses": _rep(18.0, mean_ms=3500.0, p99_ms=4200.0),
        "chunlian_misses": _rep(270.0, mean_ms=230.0, p99_ms=500.0),
    }


def test_compare_table_ratios() -> None:
    table = {r["metric"]: r for r in compare.build_table(_runs())}
    assert table["requests/s, mixed load"]["ratio"] == 20.0
    assert table["requests/s, cache misses only"]["ratio"] == 15.0
    assert table["mean latency on cache misses (ms), mixed"]["ratio"] == 15.0  # before ÷ after
    assert table["mean latency on cache hits (ms), mixed"]["ratio"] is None  # no cache before
    assert table["p99 latency (ms), mixed"]["ratio"] == 10.0
    assert table["server CPU utilisation, mixed"]["ratio"] == 1.8
    assert table["error rate, mixed"]["ratio"] is None
    md = compare.markdown_table(list(table.values()))
    assert "| requests/s, mixed load | 20.0 | 400.0 | 20× |" in md
    assert "15x" in compare.text_table(list(table.values()))
    # a ratio just under a round figure is not printed as that figure
    close = _runs()
    close["baseline_misses"] = _rep(22.2, mean_ms=3500.0, p99_ms=4200.0)
    close["chunlian_misses"] = _rep(266.3, mean_ms=230.0, p99_ms=500.0)
    row = {r["metric"]: r for r in compare.build_table(close)}["requests/s, cache misses only"]
    assert row["ratio"] == 11.995
    assert "11.995×" in compare.markdown_table([row])


def test_run_compare_measures_both_sides_on_both_loads(tmp_path: Path) -> None:
    calls: list[tuple[dict[str, object], float]] = []
    runs = _runs()
    order = iter(["baseline_mixed", "chunlian_mixed", "baseline_misses", "chunlian_misses"])

    def fake(settings: Mapping[str, object], unique_ratio: float) -> dict[str, Any]:
        calls.append((dict(settings), unique_ratio))
        return runs[next(order)]

    result = compare.run_compare(repeat_ratio=0.3, run_fn=fake, progress=False)
    assert calls == [(compare.BASELINE, 0.7), ({}, 0.7), (compare.BASELINE, 1.0), ({}, 1.0)]
    assert compare.BASELINE == {"max_batch_size": 1, "engine_replicas": 1, "max_wait_ms": 0, "cache_size": 0,
                                "coalesce": False, "default_timeout_ms": 60_000}
    assert result["ratio_requests_per_s"] == 20.0 and result["ratio_requests_per_s_misses_only"] == 15.0
    paths = compare.write_outputs(result, tmp_path)
    assert json.loads(paths["json"].read_text(encoding="utf-8"))["runs"]["chunlian_mixed"]["requests_per_s"] == 400.0
    assert "30% of requests repeat" in paths["md"].read_text(encoding="utf-8")


def test_run_compare_rounds_swap_the_sides_and_average_them(tmp_path: Path) -> None:
    """Three rounds: the baseline first, then chunlian first, then the baseline again; the
    table is built from the means, and each round's ratios and their median are kept."""
    calls: list[tuple[str, float]] = []
    baseline_rps = iter([20.0, 18.0, 25.0, 20.0, 20.0, 15.0])  # mixed, misses, for each round

    def fake(settings: Mapping[str, object], unique_ratio: float) -> dict[str, Any]:
        side = "baseline" if settings.get("max_batch_size") == 1 else "chunlian"
        calls.append((side, unique_ratio))
        if side == "baseline":
            return _rep(next(baseline_rps), p99_ms=4000.0, mean_ms=3000.0)
        return _rep(300.0, p99_ms=500.0, mean_ms=200.0, mean_hit_ms=None)

    result = compare.run_compare(repeat_ratio=0.3, run_fn=fake, progress=False, rounds=3)
    assert calls == [("baseline", 0.7), ("chunlian", 0.7), ("baseline", 1.0), ("chunlian", 1.0),
                     ("chunlian", 0.7), ("baseline", 0.7), ("chunlian", 1.0), ("baseline", 1.0),
                     ("baseline", 0.7), ("chunlian", 0.7), ("baseline", 1.0), ("chunlian", 1.0)]
    assert result["by_round"]["ratio_requests_per_s_misses_only"] == [16.667, 15.0, 20.0]
    assert result["median_ratio_requests_per_s_misses_only"] == 16.667
    assert result["runs"]["baseline_misses"]["requests_per_s"] == 17.667  # (18 + 20 + 15) / 3
    assert result["ratio_requests_per_s_misses_only"] == round(300.0 / 17.667, 3)
    assert result["runs"]["chunlian_mixed"]["mean_hit_ms"] is None and len(result["rounds"]) == 3
    md = compare.write_outputs(result, tmp_path)["md"].read_text(encoding="utf-8")
    assert "3 rounds" in md and "misses only: 16.667× / 15× / 20× (median 16.667×)" in md
    with pytest.raises(ValueError, match="rounds must be 1 or more"):
        compare.run_compare(run_fn=fake, rounds=0)


# ---- CLI --------------------------------------------------------------------------------------


def test_cli_parses_the_bench_commands() -> None:
    ap = build_parser()
    a = ap.parse_args(["bench", "http", "--concurrency", "8", "--duration", "2", "--unique-ratio", "0.7",
                       "--json", "--plot", "x.png"])
    assert (a.concurrency, a.duration, a.unique_ratio, a.json, a.plot) == (8, 2.0, 0.7, True, Path("x.png"))
    assert a.url == "http://127.0.0.1:8000" and a.requests == 100_000
    s = ap.parse_args(["bench", "sweep", "--batch-sizes", "1,8", "--wait-ms", "0,5"])
    assert s.batch_sizes == (1, 8) and s.wait_ms == (0.0, 5.0) and s.duration == 10.0 and s.concurrency == 128
    assert (s.confirm_rounds, s.confirm_top) == (2, 3)
    assert ap.parse_args(["bench", "sweep", "--confirm-rounds", "0"]).confirm_rounds == 0
    c = ap.parse_args(["bench", "compare"])
    assert c.repeat_ratio == 0.3 and c.out_dir == Path("runs/bench") and c.rounds == 1
    assert ap.parse_args(["bench", "compare", "--rounds", "3"]).rounds == 3
    for bad in (["bench", "http", "--unique-ratio", "2"], ["bench", "sweep", "--batch-sizes", "0,8"],
                ["bench", "http", "--duration", "0"], ["bench", "sweep", "--confirm-rounds", "-1"],
                ["bench", "sweep", "--confirm-top", "0"], ["bench", "compare", "--rounds", "0"]):
        with pytest.raises(SystemExit):
            ap.parse_args(bad)


def test_cli_http_fails_cleanly_without_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    from chunlian.cli import main

    assert main(["bench", "http", "--url", f"http://127.0.0.1:{free_port()}", "--duration", "1"]) == 2
    assert "does not answer" in capsys.readouterr().err
