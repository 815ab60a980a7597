"""``chunlian bench engine`` on a tiny workload: every mode runs, rounds alternate, the
report holds the keys the issue asks for."""

from __future__ import annotations

import pytest

from chunlian.bench.engine import http_requests, run, steady_rate
from chunlian.bench.plan import RequestPlan, load_lines

ASKED = ("sequential_seq_per_s", "static_seq_per_s", "continuous_seq_per_s",
         "ratio_continuous_vs_sequential", "ratio_continuous_vs_static", "p50_ms", "p99_ms",
         "max_batch_size")


def test_engine_bench_reports_every_asked_key_with_rounds() -> None:
    rep = run(max_batch_size=4, requests=12, sequential_requests=3, threads=1, rounds=2, sweep=[1, 4])
    for key in ASKED:
        assert rep[key] > 0, key
    assert rep["sequential_requests"] == 3 and rep["requests"] == 12 and rep["rounds"] == 2
    for mode in ("static", "static_retire", "continuous"):
        assert len(rep[f"{mode}_seq_per_s_by_round"]) == 2
    assert rep["static_retire_seq_per_s"] > 0 and rep["ratio_continuous_vs_static_retire"] > 0
    mean = sum(rep["continuous_seq_per_s_by_round"]) / 2
    assert abs(rep["continuous_seq_per_s"] - mean) <= 0.1
    # ratios of the rounded rates, up to the rounding of the rates themselves
    want = rep["continuous_seq_per_s"] / rep["sequential_seq_per_s"]
    assert abs(rep["ratio_continuous_vs_sequential"] - want) <= 0.02 * want
    assert [p["max_batch_size"] for p in rep["sweep"]] == [1, 4]


def test_weights_side_by_side_report_each_and_the_ratios_against_the_first() -> None:
    from chunlian.bench.engine import compare_weights
    from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS, load_weights

    rep = compare_weights([None, QUALITY_WEIGHTS], max_batch_size=4, requests=8, sequential_requests=4,
                          threads=1, rounds=2)
    first, second = rep["models"].values()
    for m in (first, second):
        assert m["batch_seq_per_s"] > 0 and m["lone_p50_ms"] > 0 and len(m["batch_seq_per_s_by_round"]) == 2
    assert "ratio_batch_seq_per_s_vs_first" in second and "ratio_batch_seq_per_s_vs_first" not in first
    want = second["batch_seq_per_s"] / first["batch_seq_per_s"]
    assert abs(second["ratio_batch_seq_per_s_vs_first"] - want) <= 0.02 * want + 0.01
    # the same weights twice are told apart by their place
    twice = compare_weights([DEFAULT_WEIGHTS, DEFAULT_WEIGHTS], max_batch_size=2, requests=4,
                            sequential_requests=2, threads=1, rounds=1)
    tag = load_weights(DEFAULT_WEIGHTS).tag
    assert list(twice["models"]) == [f"{tag} #1", f"{tag} #2"]
    with pytest.raises(ValueError, match="two weight files"):
        compare_weights([None])


def test_the_mix_is_distinct_at_any_size() -> None:
    """Repeated lines would be coalesced into one generation and inflate the throughput
    (before this test, 1,600 requests held only 800 distinct lines)."""
    from chunlian.bench.engine import mixed_lines

    for n in (400, 800, 2000):
        mix = mixed_lines(n)
        assert len(mix) == n and len(set(mix)) == n
        assert all(1 <= len(u) <= 32 for u in mix)


def test_http_requests_mirror_the_load_testers_bodies_and_seeded_share() -> None:
    """The offline peak's requests are the load tester's fresh bodies (same lines, styles,
    seeds), with the asked share of seeded (sampled) ones spread through the list."""
    plan = RequestPlan(load_lines(), unique_ratio=1.0)
    bodies = [plan.next_body() for _ in range(plan.greedy_pool + 400)]
    greedy = [(b["upper"], b["style"]) for b in bodies if "seed" not in b]
    seeded = {(b["upper"], b["style"], b["seed"]) for b in bodies if "seed" in b}
    assert [(r.upper, r.style) for r in http_requests(300)] == greedy[:300]
    mix = http_requests(400, seeded_share=0.25)
    sampled = [r for r in mix if not r.params.greedy]
    assert len(mix) == 400 and len(sampled) == 100
    assert {(r.upper, r.style, r.params.seed) for r in sampled} <= seeded
    assert [(r.upper, r.style) for r in mix if r.params.greedy] == greedy[:300]
    # spread evenly: every quarter of the list holds a quarter of the sampled ones
    for q in range(4):
        assert sum(not r.params.greedy for r in mix[q * 100:(q + 1) * 100]) == 25
    with pytest.raises(ValueError, match="seeded_share"):
        http_requests(10, seeded_share=1.5)


def test_steady_rate_leaves_out_the_filling_and_the_draining_batch() -> None:
    # 100 requests at once: the first 10 done late (a full batch's prompts first), 10 to 90
    # at 10 a second, the last 10 slowly (a draining batch)
    done = [1.0] * 10 + [1.0 + (i + 1) / 10 for i in range(80)] + [20.0 + i for i in range(10)]
    assert abs(steady_rate(done) - 10.0) < 0.2  # the whole-run rate, 100 / 29, says 3.4
    assert steady_rate([]) == 0.0 and steady_rate([1.0, 1.0, 1.0]) == 0.0
