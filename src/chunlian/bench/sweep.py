"""``chunlian bench sweep``: throughput and p99 against ``max_batch_size`` (and ``max_wait_ms``).

For every point the service is started afresh (``python -m chunlian.api`` in a subprocess on
a free loopback port, the result cache off so that every request reaches the model, no
start-up warm-up), warmed up by the load generator for a moment, then driven with the same
closed-loop load; the point's figures come from the client and from ``/metrics``. The
leading points are then measured again in interleaved rounds (``confirm_points``) and the
best setting is chosen among their means, since a single pass lets the host's drift pick it.
The results go to a Markdown table, a JSON file and a PNG plot.

Inherited ``CHUNLIAN_*`` variables are not passed on: every point runs the defaults plus the
point's own settings (and ``--model-path``, ``--device``, ``--torch-threads`` when given), so
a Redis URL or a cache size in the caller's environment cannot leak into the figures.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chunlian.bench.common import can_plot, mean_fields, pyplot
from chunlian.bench.loadgen import run_load
from chunlian.bench.plan import RequestPlan, load_lines
from chunlian.bench.spawn import Spawned, serving
from chunlian.cluster.procs import free_port

DEFAULT_BATCH_SIZES = (1, 4, 8, 16, 32, 64, 128)
DEFAULT_WAITS_MS = (0.0, 5.0, 20.0)


def server_env(settings: Mapping[str, object], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without any ``CHUNLIAN_*`` variable,
    plus ``CHUNLIAN_<NAME>`` for each of ``settings`` (None values left out)."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.upper().startswith("CHUNLIAN_")}
    for name, value in settings.items():
        if value is not None:
            env[f"CHUNLIAN_{name.upper()}"] = str(value)
    return env


@contextmanager
def run_server(settings: Mapping[str, object], ready_limit_s: float = 180.0,
               source: Path | None = None) -> Iterator[Spawned]:
    """Start the service with ``settings`` (``CHUNLIAN_*`` names, lower case), wait until
    ``/readyz`` says 200, yield it, then stop it (SIGTERM, then SIGKILL after 20 s).
    ``source``: serve the ``chunlian`` package of another checkout (its ``src/`` folder), to
    measure two versions side by side in one run."""
    port = free_port()
    base = {"host": "127.0.0.1", "port": port, "warmup": "", "log_level": "WARNING"}
    env = server_env({**base, **settings})
    if source is not None:
        env["PYTHONPATH"] = str(source)
    with serving([sys.executable, "-m", "chunlian.api"], port, what="the service",
                 limit_s=ready_limit_s, env=env, temp_log=True) as srv:
        yield srv


def point_row(batch: int, wait_ms: float, rep: dict[str, Any]) -> dict[str, Any]:
    """The sweep table's row for one point."""
    return {
        "max_batch_size": batch, "max_wait_ms": wait_ms,
        "requests_per_s": rep["requests_per_s"], "p50_ms": rep["p50_ms"], "p95_ms": rep["p95_ms"],
        "p99_ms": rep["p99_ms"], "mean_batch_size": rep.get("mean_batch_size"),
        "tokens_per_s": rep.get("tokens_per_s"), "errors": sum(rep["errors"].values()),
        "error_rate": rep["error_rate"], "server_cpu_cores": rep.get("server_cpu_cores"),
        "queue_depth_mean": rep.get("queue_depth_mean"), "requests": rep["requests"],
        "requests_per_cpu_s": rep.get("requests_per_cpu_s"), "host_other_cores": rep.get("host_other_cores"),
    }


def _within(row: dict[str, Any], slo_p99_ms: float) -> bool:
    """No errors and a p99 inside the SLO."""
    return row["errors"] == 0 and row["p99_ms"] is not None and row["p99_ms"] <= slo_p99_ms


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points with a p99 (the rule's pool when none is inside the SLO)."""
    return [r for r in rows if r["p99_ms"] is not None]


def _candidates(rows: list[dict[str, Any]], slo_p99_ms: float) -> list[dict[str, Any]]:
    """The points a best one is chosen from: those without errors and with p99 within the
    SLO, or, when there are none, every point with a p99."""
    return [r for r in rows if _within(r, slo_p99_ms)] or _measured(rows)


def pick_best(rows: list[dict[str, Any]], slo_p99_ms: float, near: float = 0.05) -> dict[str, Any] | None:
    """The best point: among those without errors and with p99 within the SLO, the ones
    within ``near`` of the highest requests/s; of those, the lowest p99. Without any point
    inside the SLO, the highest requests/s."""
    pool = _candidates(rows, slo_p99_ms)
    if not pool:
        return None
    top = max(r["requests_per_s"] for r in pool)
    close = [r for r in pool if r["requests_per_s"] >= (1 - near) * top]
    return min(close, key=lambda r: (r["p99_ms"], r["max_batch_size"]))


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:g}" if abs(v) >= 100 or v == int(v) else f"{v:.2f}".rstrip("0").rstrip(".")
    return str(v)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table, one row per point."""
    cols = [("max_batch_size", "max_batch_size"), ("max_wait_ms", "max_wait_ms"),
            ("requests_per_s", "requests/s"), ("p50_ms", "p50 ms"), ("p95_ms", "p95 ms"),
            ("p99_ms", "p99 ms"), ("mean_batch_size", "mean batch"), ("tokens_per_s", "tokens/s"),
            ("server_cpu_cores", "server CPU (cores)"), ("requests_per_cpu_s", "req per server CPU-s"),
            ("host_other_cores", "other load (cores)"), ("errors", "errors")]
    head = "| " + " | ".join(t for _, t in cols) + " |"
    rule = "|" + "|".join("---:" for _ in cols) + "|"
    body = ["| " + " | ".join(_fmt(r.get(k)) for k, _ in cols) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Requests/s and p99 against max_batch_size, one line per max_wait_ms (log2 x axis)."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for wait in sorted({r["max_wait_ms"] for r in rows}):
        pts = sorted((r for r in rows if r["max_wait_ms"] == wait), key=lambda r: r["max_batch_size"])
        xs = [r["max_batch_size"] for r in pts]
        a1.plot(xs, [r["requests_per_s"] for r in pts], marker="o", label=f"max_wait_ms={_fmt(wait)}")
        a2.plot(xs, [r["p99_ms"] if r["p99_ms"] is not None else float("nan") for r in pts],
                marker="o", label=f"max_wait_ms={_fmt(wait)}")
    for ax, ylabel in ((a1, "requests/s (cache off)"), (a2, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        xt = sorted({r["max_batch_size"] for r in rows})
        ax.set_xticks(xt, [str(x) for x in xt])
        ax.set_xlabel("max_batch_size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    a2.set_yscale("log")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def measure_point(
    batch: int, wait: float, lines: list[str], *, concurrency: int, duration_s: float, warmup_s: float,
    max_requests: int, unique_ratio: float, extra_settings: Mapping[str, object] | None, progress: bool,
) -> dict[str, Any]:
    """One point on a fresh cache-off server: its table row, with the full load report under
    ``"report"``."""
    settings = {**(extra_settings or {}), "max_batch_size": batch, "max_wait_ms": wait, "cache_size": 0}
    with run_server(settings) as srv:
        res = run_load(srv.url, concurrency, duration_s, max_requests,
                       RequestPlan(lines, unique_ratio=unique_ratio), warmup_s=warmup_s,
                       server_pid=srv.pid, progress=progress, label=f"batch {batch:>3} wait {wait:g} ms")
    rep = res.report()
    return {**point_row(batch, wait, rep), "report": rep}


def _log_row(row: dict[str, Any], log: Any, prefix: str = "") -> None:
    if log is not None:
        print(f"{prefix}max_batch_size={row['max_batch_size']:<4} max_wait_ms={row['max_wait_ms']:<5g} "
              f"{row['requests_per_s']:>8} req/s  p99 {row['p99_ms']} ms  mean batch {row['mean_batch_size']}  "
              f"errors {row['errors']}", file=log, flush=True)


def run_sweep(
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    waits_ms: tuple[float, ...] = DEFAULT_WAITS_MS,
    *,
    concurrency: int = 128,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    max_requests: int = 1_000_000,
    data: Path | None = None,
    unique_ratio: float = 1.0,
    extra_settings: Mapping[str, object] | None = None,
    progress: bool = True,
    log: Any = None,
) -> list[dict[str, Any]]:
    """Run every (max_wait_ms, max_batch_size) point; return one row per point (with the
    full load report under ``"report"``), ordered by wait, then batch size.

    The points of one batch size run one after the other, their wait order reversed at
    every other batch size: the host's speed drifts over a sweep, and running every batch
    size at one wait before the next wait makes the drift look like a wait effect
    (``docs/performance.md``, "Measurements behind the code")."""
    lines = load_lines(data)
    kw = {"concurrency": concurrency, "duration_s": duration_s, "warmup_s": warmup_s,
          "max_requests": max_requests, "unique_ratio": unique_ratio, "extra_settings": extra_settings,
          "progress": progress}
    rows: list[dict[str, Any]] = []
    for k, batch in enumerate(batch_sizes):
        for wait in waits_ms if k % 2 == 0 else waits_ms[::-1]:
            rows.append(measure_point(batch, wait, lines, **kw))  # type: ignore[arg-type]
            _log_row(rows[-1], log)
    order = {w: i for i, w in enumerate(waits_ms)}
    rows.sort(key=lambda r: (order[r["max_wait_ms"]], batch_sizes.index(r["max_batch_size"])))
    return rows


def leading_points(rows: list[dict[str, Any]], slo_p99_ms: float, top: int) -> list[tuple[int, float]]:
    """The points a confirmation measures again: the ``top`` with the most requests/s among
    those ``pick_best`` chooses from, then, if not among them, the ``top`` with the most
    requests/s of all: the rule's fallback when no point keeps the SLO, which the repeated
    rounds may find: when the few points that kept the SLO in the pass fail it when measured
    again, the fallback must not choose among those slow points alone
    (``docs/performance.md``)."""
    def most(pool: list[dict[str, Any]]) -> list[tuple[int, float]]:
        return [(r["max_batch_size"], r["max_wait_ms"]) for r in sorted(pool, key=lambda r: -r["requests_per_s"])[:top]]

    points = most(_candidates(rows, slo_p99_ms))
    return points + [p for p in most(_measured(rows)) if p not in points]


def mean_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One point's rows from several runs as one: numeric figures averaged (None if any run
    lacks one), errors and requests summed, each run's requests/s and p99 kept under ``"rounds"``."""
    out: dict[str, Any] = {"max_batch_size": runs[0]["max_batch_size"], "max_wait_ms": runs[0]["max_wait_ms"],
                           "p99_ms": None, "mean_batch_size": None}
    fields = mean_fields([{k: v for k, v in r.items() if k != "report"} for r in runs], ("errors", "requests"))
    out.update({k: v for k, v in fields.items() if k not in ("max_batch_size", "max_wait_ms")})
    out["rounds"] = [{"requests_per_s": r["requests_per_s"], "p99_ms": r["p99_ms"]} for r in runs]
    return out


def confirm_points(
    points: list[tuple[int, float]], rounds: int, data: Path | None = None, log: Any = None, **kw: Any,
) -> list[dict[str, Any]]:
    """Measure ``points`` again in ``rounds`` interleaved rounds, the order reversed every
    other round, and return one averaged row per point (``mean_row``), in ``points`` order.

    One pass of a sweep measures each point once, minutes apart; on a shared host the drift
    between them can exceed the differences the sweep is for, and even reverse the order of
    two points (``docs/performance.md``)."""
    lines = load_lines(data)
    runs: dict[tuple[int, float], list[dict[str, Any]]] = {p: [] for p in points}
    for r in range(rounds):
        for batch, wait in points if r % 2 == 0 else points[::-1]:
            row = measure_point(batch, wait, lines, **kw)
            runs[(batch, wait)].append(row)
            _log_row(row, log, prefix=f"confirm {r + 1}/{rounds}: ")
    return [mean_row(runs[p]) for p in points]


def _rule(best: dict[str, Any], slo_p99_ms: float) -> str:
    return (f"the highest requests/s without errors and with p99 <= {slo_p99_ms:g} ms" if _within(best, slo_p99_ms)
            else f"no point kept p99 <= {slo_p99_ms:g} ms at this concurrency, so the highest requests/s")


def _best_line(best: dict[str, Any], slo_p99_ms: float, label: str = "Best here") -> str:
    return (f"{label}: max_batch_size={best['max_batch_size']}, max_wait_ms={_fmt(best['max_wait_ms'])} "
            f"({best['requests_per_s']} req/s, p99 {best['p99_ms']} ms; rule: {_rule(best, slo_p99_ms)}, "
            "points within 5% of it broken by the lower p99).")


def confirmation_table(rows: list[dict[str, Any]]) -> str:
    """The re-measured points: the rounds' means and each round's requests/s."""
    head = "| max_batch_size | max_wait_ms | requests/s (mean) | each round | p99 ms (mean) | mean batch | errors |"
    rule = "|---:|---:|---:|---|---:|---:|---:|"
    body = [f"| {r['max_batch_size']} | {_fmt(r['max_wait_ms'])} | {_fmt(r['requests_per_s'])} | "
            + " / ".join(_fmt(x["requests_per_s"]) for x in r["rounds"])
            + f" | {_fmt(r['p99_ms'])} | {_fmt(r['mean_batch_size'])} | {r['errors']} |" for r in rows]
    return "\n".join([head, rule, *body])


def write_outputs(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any], slo_p99_ms: float,
                  plot_path: Path | None = None, confirmed: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """sweep.md, sweep.json and the plot (sweep.png, or ``plot_path``) under ``out_dir``; the
    plot only where matplotlib is installed (the ``plot`` extra) unless ``plot_path`` asks for it.
    With ``confirmed`` (``confirm_points``' rows) the best point is chosen among those, by
    the same rule; the single pass's choice is kept beside it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = [{k: v for k, v in r.items() if k != "report"} for r in rows]
    single = pick_best(table, slo_p99_ms)
    best = pick_best(confirmed, slo_p99_ms) if confirmed else single
    md = [f"# chunlian sweep: {meta.get('title', '')}".rstrip(": "), "",
          "Closed-loop load, cache off, every request a fresh real upper line. "
          + ", ".join(f"{k}={v}" for k, v in meta.items() if k != "title"), "",
          markdown_table(table), ""]
    if confirmed:
        n = len(confirmed[0]["rounds"])
        md += [f"The {len(confirmed)} leading points measured again in {n} interleaved rounds (the order "
               "reversed every other round), so that the host's drift between points a pass apart "
               "does not choose the setting:", "", confirmation_table(confirmed), ""]
        if single is not None:
            md.append(_best_line(single, slo_p99_ms, "Best by the single pass"))
            md.append("")
    if best is not None:
        md.append(_best_line(best, slo_p99_ms, "Best here (confirmed)" if confirmed else "Best here"))
    paths = {"md": out_dir / "sweep.md", "json": out_dir / "sweep.json"}
    paths["md"].write_text("\n".join(md) + "\n", encoding="utf-8")
    doc = {"meta": meta, "best": best, "best_single_pass": single, "slo_p99_ms": slo_p99_ms,
           "confirmation": confirmed or [], "rows": rows}
    paths["json"].write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    if plot_path is not None or can_plot():
        paths["png"] = plot_sweep(table, plot_path or out_dir / "sweep.png", title=str(meta.get("title", "")))
    return paths
