"""The report of ``chunlian bench engine`` (``bench.engine.run``): each mode's rate, the
ratios between them, latencies and the rate of every round."""

from __future__ import annotations

from typing import Any

MODES = ("static", "static_retire", "continuous")


def rates(modes: dict[str, list[dict[str, float]]], means: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The three modes' rates, their ratios and latencies, and the rates of every round."""
    seq, static, cont = means["sequential"], means["static"], means["continuous"]
    retire = means["static_retire"]
    return {
        "sequential_seq_per_s": round(seq["seq_per_s"], 1),
        "static_seq_per_s": round(static["seq_per_s"], 1),
        "continuous_seq_per_s": round(cont["seq_per_s"], 1),
        "ratio_continuous_vs_sequential": round(cont["seq_per_s"] / seq["seq_per_s"], 2),
        "ratio_continuous_vs_static": round(cont["seq_per_s"] / static["seq_per_s"], 2),
        "static_retire_seq_per_s": round(retire["seq_per_s"], 1),
        "ratio_continuous_vs_static_retire": round(cont["seq_per_s"] / retire["seq_per_s"], 2),
        "p50_ms": round(cont["p50_ms"], 1),
        "p99_ms": round(cont["p99_ms"], 1),
        "sequential_p50_ms": round(seq["p50_ms"], 1),
        "static_p99_ms": round(static["p99_ms"], 1),
        "continuous_mean_tokens_per_step": round(cont["mean_batch"], 1),
        **{f"{m}_seq_per_s_by_round": [round(x["seq_per_s"], 1) for x in modes[m]] for m in MODES},
    }


def replica_rates(replica_runs: list[dict[str, Any]], replicas: int,
                   means: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``continuous_replicas``' mean rates and their ratios to sequential and continuous."""
    rep_rate = sum(r["seq_per_s"] for r in replica_runs) / len(replica_runs)
    return {
        "replicas": replicas,
        "continuous_replicas_seq_per_s": round(rep_rate, 1),
        "continuous_replicas_steady_seq_per_s": round(
            sum(r["steady_seq_per_s"] for r in replica_runs) / len(replica_runs), 1),
        "ratio_continuous_replicas_vs_sequential": round(rep_rate / means["sequential"]["seq_per_s"], 2),
        "ratio_continuous_replicas_vs_continuous": round(rep_rate / means["continuous"]["seq_per_s"], 2),
        "continuous_replicas_seq_per_s_by_round": [r["seq_per_s"] for r in replica_runs],
    }
