"""``chunlian bench compare``: the before/after table, measured in one run.

* before (baseline): ``max_batch_size=1`` (one request at a time, one engine with every
  core: ``engine_replicas=1``, as the auto setting gives for one row), ``max_wait_ms=0``, no
  result cache (``CHUNLIAN_CACHE_SIZE=0``) and no coalescing of identical requests in
  flight (``CHUNLIAN_COALESCE=false``): with it, the mixed load's hot repeats share the
  generation already running (over a quarter of the baseline's requests at c=128), so the
  baseline would have a cache of its own and the repeats would lift both sides alike; and a 60 s
  deadline, so that a slow host's batch-1 queue shows as latency, not as 504s;
* after (chunlian): the service's defaults (continuous batching, in-process cache, one
  engine replica per core: ``engine.replicas``).

The load is a closed loop of ``concurrency`` clients, 128 by default: the default
``max_batch_size``, so that the defaults can fill their batch (at 64, only 64 of its 128 rows
could ever be busy, and the misses ratio comes out lower: ``docs/performance.md``).

Each side is started afresh (``sweep.run_server``) for each of two loads, the same
requests in the same order on both sides: *mixed*, where ``repeat_ratio`` of the requests
repeat a small hot set of lines (the rest are fresh), and *misses only*, every request
fresh. The table reports requests/s, mean latency on cache hits and on misses (split by the
response's ``cached`` field), p99, and the server process's CPU utilisation, with a ratio
column; the whole record is saved as JSON.

With ``rounds`` > 1 the four runs are repeated, before and after swapping places within each
load every other round, and the table is built from each run's figures averaged over the
rounds; each round's headline ratios and their median are reported beside it: one round's
ratio moves by a third from run to run on a shared host, most of it the batch-1 baseline's
(``docs/performance.md``, "Measurements behind the code").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from statistics import median
from typing import Any

from chunlian.bench.common import mean_fields
from chunlian.bench.loadgen import run_load
from chunlian.bench.plan import RequestPlan, load_lines
from chunlian.bench.sweep import run_server

BASELINE: dict[str, object] = {"max_batch_size": 1, "engine_replicas": 1, "max_wait_ms": 0, "cache_size": 0,
                               "coalesce": False, "default_timeout_ms": 60_000}
CHUNLIAN: dict[str, object] = {}  # the defaults

RunFn = Callable[[Mapping[str, object], float], dict[str, Any]]


def _ratio(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or before == 0:
        return None
    # three decimals: at two, 266.3 / 22.2 = 11.9955 printed as "12x", on the target
    return round(after / before, 3)


def build_table(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of (metric, before, after, ratio) from the four runs' reports.

    ``ratio`` is after ÷ before for requests/s, CPU and batch size, and before ÷ after for
    latencies, so that above 1 means chunlian does better (CPU: uses more of the machine).
    """
    bm, cm = runs["baseline_mixed"], runs["chunlian_mixed"]
    bo, co = runs["baseline_misses"], runs["chunlian_misses"]

    def row(name: str, key: str, b: dict[str, Any], c: dict[str, Any], inverse: bool = False,
            ratio: bool = True) -> dict[str, Any]:
        before, after = b.get(key), c.get(key)
        r = (_ratio(before, after) if inverse else _ratio(after, before)) if ratio else None
        return {"metric": name, "before": before, "after": after, "ratio": r}

    return [
        row("requests/s, mixed load", "requests_per_s", bm, cm),
        row("requests/s, cache misses only", "requests_per_s", bo, co),
        row("mean latency on cache hits (ms), mixed", "mean_hit_ms", bm, cm, inverse=True),
        row("mean latency on cache misses (ms), mixed", "mean_miss_ms", bm, cm, inverse=True),
        row("mean latency (ms), misses only", "mean_ms", bo, co, inverse=True),
        row("p99 latency (ms), mixed", "p99_ms", bm, cm, inverse=True),
        row("p99 latency (ms), misses only", "p99_ms", bo, co, inverse=True),
        row("server CPU utilisation, mixed", "server_cpu_util", bm, cm),
        row("requests per server CPU-second, mixed", "requests_per_cpu_s", bm, cm),
        row("server CPU utilisation, misses only", "server_cpu_util", bo, co),
        row("requests per server CPU-second, misses only", "requests_per_cpu_s", bo, co),
        row("cache hit ratio (/metrics), mixed", "cache_hit_ratio", bm, cm),
        row("mean engine batch size, mixed", "mean_batch_size", bm, cm),
        row("error rate, mixed", "error_rate", bm, cm, ratio=False),
        row("other processes' CPU (cores), mixed", "host_other_cores", bm, cm, ratio=False),
        row("other processes' CPU (cores), misses only", "host_other_cores", bo, co, ratio=False),
    ]


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def markdown_table(table: list[dict[str, Any]]) -> str:
    lines = ["| metric | before: batch 1, no cache | after: chunlian defaults | ratio |",
             "|---|---:|---:|---:|"]
    for r in table:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:g}×"
        lines.append(f"| {r['metric']} | {_cell(r['before'])} | {_cell(r['after'])} | {ratio} |")
    return "\n".join(lines)


def text_table(table: list[dict[str, Any]]) -> str:
    w = max(len(r["metric"]) for r in table)
    out = [f"{'metric':{w}s}  {'before':>10s}  {'after':>10s}  {'ratio':>7s}"]
    for r in table:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:g}x"
        out.append(f"{r['metric']:{w}s}  {_cell(r['before']):>10s}  {_cell(r['after']):>10s}  {ratio:>7s}")
    return "\n".join(out)


def run_compare(
    *,
    concurrency: int = 128,  # fills the default max_batch_size: at 64, half of it idles
    duration_s: float = 15.0,
    warmup_s: float = 2.0,
    repeat_ratio: float = 0.3,
    hot_size: int = 16,
    data: Path | None = None,
    extra_settings: Mapping[str, object] | None = None,
    progress: bool = True,
    run_fn: RunFn | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Measure the four runs (``rounds`` times) and return ``{"meta", "runs", "table", ...}``."""
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, got {rounds}")
    lines = load_lines(data)
    extra = dict(extra_settings or {})

    def default_run(settings: Mapping[str, object], unique_ratio: float) -> dict[str, Any]:
        label = f"{'baseline' if settings.get('max_batch_size') == 1 else 'chunlian'} u={unique_ratio:g}"
        with run_server({**extra, **settings}) as srv:
            res = run_load(srv.url, concurrency, duration_s, 1_000_000,
                           RequestPlan(lines, unique_ratio=unique_ratio, hot_size=hot_size),
                           warmup_s=warmup_s, server_pid=srv.pid, progress=progress, label=label)
        return res.report()

    run = run_fn or default_run
    mixed = round(1.0 - repeat_ratio, 4)
    plan = [("baseline_mixed", BASELINE, mixed), ("chunlian_mixed", CHUNLIAN, mixed),
            ("baseline_misses", BASELINE, 1.0), ("chunlian_misses", CHUNLIAN, 1.0)]
    swapped = [plan[1], plan[0], plan[3], plan[2]]
    per_round: list[dict[str, dict[str, Any]]] = []
    for r in range(rounds):
        per_round.append({name: run(settings, u) for name, settings, u in (plan if r % 2 == 0 else swapped)})
    runs = per_round[0] if rounds == 1 else {name: mean_fields([rr[name] for rr in per_round])
                                             for name, _, _ in plan}
    table = build_table(runs)
    result: dict[str, Any] = {
        "meta": {"concurrency": concurrency, "duration_s": duration_s, "warmup_s": warmup_s,
                 "repeat_ratio": repeat_ratio, "hot_size": hot_size, "lines": len(lines), "rounds": rounds,
                 "baseline": BASELINE, "chunlian": CHUNLIAN or "defaults", "settings": extra},
        "ratio_requests_per_s": table[0]["ratio"],
        "ratio_requests_per_s_misses_only": table[1]["ratio"],
        "table": table,
        "runs": runs,
    }
    if rounds > 1:
        by_round = [build_table(rr)[:2] for rr in per_round]
        mixed_ratios = [t[0]["ratio"] for t in by_round]
        miss_ratios = [t[1]["ratio"] for t in by_round]
        result["by_round"] = {"ratio_requests_per_s": mixed_ratios, "ratio_requests_per_s_misses_only": miss_ratios}
        result["median_ratio_requests_per_s"] = _median(mixed_ratios)
        result["median_ratio_requests_per_s_misses_only"] = _median(miss_ratios)
        result["rounds"] = per_round
    return result


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(median(vals), 3) if vals else None


def write_outputs(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """compare.json and compare.md under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "compare.json", "md": out_dir / "compare.md"}
    paths["json"].write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    m = result["meta"]
    md = ["# chunlian before/after", "",
          f"Closed-loop load, concurrency {m['concurrency']}, {m['duration_s']:g} s per run; mixed load: "
          f"{m['repeat_ratio']:.0%} of requests repeat a hot set of {m['hot_size']} lines.", "",
          markdown_table(result["table"]), "",
          "ratio: after ÷ before for requests/s, CPU and batch size; before ÷ after for latencies."]
    if "by_round" in result:
        br = result["by_round"]
        md += ["", f"{m['rounds']} rounds (before and after swapping places every other round); the table holds "
               "each run's figures averaged over them. requests/s ratio by round, mixed: "
               + " / ".join(f"{x:g}×" for x in br["ratio_requests_per_s"] if x is not None)
               + f" (median {result['median_ratio_requests_per_s']:g}×); misses only: "
               + " / ".join(f"{x:g}×" for x in br["ratio_requests_per_s_misses_only"] if x is not None)
               + f" (median {result['median_ratio_requests_per_s_misses_only']:g}×)."]
    paths["md"].write_text("\n".join(md) + "\n", encoding="utf-8")
    return paths
