"""``chunlian bench http | sweep | compare``: load tests of the HTTP service.

* ``http``: drive a running service (loopback by default, or ``--url``) for a bounded time
  and request count; print (or ``--json``) requests/s, latency quantiles, errors by status,
  and the cache hit ratio, mean batch size and tokens/s read from its ``/metrics``.
* ``sweep``: start the service once per (``max_wait_ms``, ``max_batch_size``) point, drive
  each with the same load; write sweep.md, sweep.json and a plot.
* ``compare``: before (batch 1, no cache) against after (chunlian's defaults), on a mixed
  load and on cache misses only; print the table, write compare.json and compare.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from chunlian.bench.common import PLOT_EXTRA, can_plot
from chunlian.cliargs import add_no_progress, hidden_alias, positive


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _csv_floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"expected numbers >= 0, got {text!r}")
    return vals


def _ratio(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text!r}")
    return v


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return v


def _fail(msg: str, code: int = 2) -> int:
    print(f"chunlian bench: error: {msg}", file=sys.stderr)
    return code


def _server_settings(args: argparse.Namespace) -> dict[str, object]:
    return {"model_path": args.model_path, "device": args.device, "torch_threads": args.torch_threads}


def _progress(args: argparse.Namespace) -> bool:
    return not args.no_progress and sys.stderr.isatty()


# ---- handlers ---------------------------------------------------------------------------------


def cmd_http(args: argparse.Namespace) -> int:
    import httpx

    from chunlian.bench.loadgen import format_report, plot_timeline, run_load
    from chunlian.bench.plan import RequestPlan, check_url, is_loopback, load_lines

    if args.plot and not can_plot():
        return _fail(PLOT_EXTRA)
    try:
        url = check_url(args.url)
        plan = RequestPlan(load_lines(args.data), unique_ratio=args.unique_ratio, hot_size=args.hot_size,
                           seed=args.seed)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    if not is_loopback(url):
        print(f"chunlian bench http: driving {url} (not loopback)", file=sys.stderr)
    try:
        ready = httpx.get(url + "/readyz", timeout=10.0)
    except httpx.HTTPError as e:
        return _fail(f"{url} does not answer: {type(e).__name__}: {e}")
    if ready.status_code != 200:
        print(f"chunlian bench http: {url}/readyz says {ready.status_code}; measuring anyway", file=sys.stderr)
    res = run_load(url, args.concurrency, args.duration, args.requests, plan,
                   warmup_s=args.warmup, timeout_s=args.timeout, server_pid=args.server_pid,
                   progress=_progress(args) and not args.json, label="http", client_kind=args.client)
    rep = res.report()
    if args.plot:
        rep["plot"] = str(plot_timeline(res, args.plot))
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
    else:
        print(format_report(rep))
    return 0 if rep["ok"] > 0 else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from chunlian.bench.sweep import confirm_points, leading_points, run_sweep, write_outputs

    if args.plot and not can_plot():
        return _fail(PLOT_EXTRA)
    load = {"concurrency": args.concurrency, "duration_s": args.duration, "warmup_s": args.warmup,
            "max_requests": args.requests, "unique_ratio": 1.0, "extra_settings": _server_settings(args),
            "progress": _progress(args)}
    try:
        rows = run_sweep(args.batch_sizes, args.wait_ms, data=args.data, log=sys.stderr, **load)
        confirmed = None
        if args.confirm_rounds:
            points = leading_points(rows, args.slo_p99_ms, args.confirm_top)
            confirmed = confirm_points(points, args.confirm_rounds, data=args.data, log=sys.stderr, **load)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    except RuntimeError as e:
        return _fail(str(e), 1)
    meta = {"title": args.title, "concurrency": args.concurrency, "duration_s": args.duration,
            "warmup_s": args.warmup, "confirm_rounds": args.confirm_rounds,
            **{k: v for k, v in _server_settings(args).items() if v is not None}}
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in meta.items()}
    paths = write_outputs(rows, args.out_dir, meta, args.slo_p99_ms, args.plot, confirmed)
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "report"} for r in rows],
                          "confirmation": confirmed or [],
                          "files": {k: str(p) for k, p in paths.items()}}, ensure_ascii=False))
    else:
        print(paths["md"].read_text(encoding="utf-8"))
        print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from chunlian.bench.compare import run_compare, text_table, write_outputs

    try:
        result = run_compare(concurrency=args.concurrency, duration_s=args.duration, warmup_s=args.warmup,
                             repeat_ratio=args.repeat_ratio, hot_size=args.hot_size, data=args.data,
                             extra_settings=_server_settings(args), progress=_progress(args),
                             rounds=args.rounds)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    except RuntimeError as e:
        return _fail(str(e), 1)
    paths = write_outputs(result, args.out_dir)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "rounds")}, ensure_ascii=False))
    else:
        print(text_table(result["table"]))
        if "by_round" in result:
            print(f"misses-only ratio by round: {result['by_round']['ratio_requests_per_s_misses_only']} "
                  f"(median {result['median_ratio_requests_per_s_misses_only']})")
        print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


# ---- parsers ----------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, concurrency: int, duration: float, warmup: float) -> None:
    p.add_argument("--concurrency", type=positive(int), default=concurrency,
                   help=f"requests in flight at once (closed loop; default {concurrency})")
    p.add_argument("--duration-s", dest="duration", type=positive(float), default=duration,
                   help=f"seconds of measured load per run (default {duration:g})")
    hidden_alias(p, "--duration", "duration", type=positive(float))
    p.add_argument("--warmup-s", dest="warmup", type=float, default=warmup,
                   help=f"seconds of unmeasured warm-up load first (default {warmup:g})")
    hidden_alias(p, "--warmup", "warmup", type=float)
    p.add_argument("--data", type=Path, default=None,
                   help="upper lines, one a line (.tsv: first column); default: the built-in 400")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_no_progress(p)


def _server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", type=Path, default=None, help="CHUNLIAN_MODEL_PATH of the servers")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                   help="CHUNLIAN_DEVICE of the servers (default auto)")
    p.add_argument("--torch-threads", type=int, default=None, help="CHUNLIAN_TORCH_THREADS")
    p.add_argument("--out-dir", type=Path, default=Path("runs/bench"), help="where results go (default runs/bench/, git-ignored)")


def register(bsub: Any) -> None:
    """Add ``http``, ``sweep`` and ``compare`` to the ``chunlian bench`` sub-commands."""
    from chunlian.bench.plan import DEFAULT_URL

    h = bsub.add_parser("http", help="load-test a running service over HTTP")
    h.add_argument("--url", default=DEFAULT_URL, help=f"the service (default {DEFAULT_URL})")
    _common(h, concurrency=32, duration=10.0, warmup=0.0)
    h.add_argument("--requests", type=positive(int), default=100_000, help="most requests to send (default 100000)")
    h.add_argument("--unique-ratio", type=_ratio, default=1.0,
                   help="share of requests that are fresh lines; the rest repeat a hot set (default 1)")
    h.add_argument("--hot-size", type=positive(int), default=16, help="lines in the hot set (default 16)")
    h.add_argument("--seed", type=int, default=0, help="seed of the request mix; another seed sends other fresh requests (default 0)")
    h.add_argument("--timeout-s", dest="timeout", type=positive(float), default=30.0,
                   help="per-request client timeout, seconds (default 30)")
    hidden_alias(h, "--timeout", "timeout", type=positive(float))
    h.add_argument("--client", choices=["auto", "raw", "httpx"], default="auto",
                   help="raw: a lean HTTP/1.1 client (http only); auto: raw for http, httpx for https")
    h.add_argument("--server-pid", type=int, default=None, help="a local server process: report its CPU use")
    h.add_argument("--plot", type=Path, default=None, help="write requests/s and latency over time (PNG)")
    h.set_defaults(fn=cmd_http)

    s = bsub.add_parser("sweep", help="throughput and p99 by max_batch_size and max_wait_ms (starts the service)")
    _common(s, concurrency=128, duration=10.0, warmup=2.0)
    _server_flags(s)
    s.add_argument("--batch-sizes", type=_csv_ints, default=(1, 4, 8, 16, 32, 64, 128),
                   help="max_batch_size values (default 1,4,8,16,32,64,128)")
    s.add_argument("--wait-ms", type=_csv_floats, default=(0.0, 5.0, 20.0),
                   help="max_wait_ms values (default 0,5,20)")
    s.add_argument("--requests", type=positive(int), default=1_000_000, help="most requests per point")
    s.add_argument("--slo-p99-ms", type=positive(float), default=1000.0,
                   help="p99 bound used to pick the best point (default 1000)")
    s.add_argument("--confirm-rounds", type=_non_negative_int, default=2,
                   help="measure the leading points again in this many interleaved rounds and choose "
                        "the best among their means (default 2; 0: the single pass decides)")
    s.add_argument("--confirm-top", type=positive(int), default=3,
                   help="how many leading points to measure again (default 3): the leaders inside the "
                        "p99 bound and, if others, the leaders by requests/s alone")
    s.add_argument("--plot", type=Path, default=None, help="the plot's path (default OUT_DIR/sweep.png)")
    s.add_argument("--title", default="", help="a title for the table and the plot")
    s.set_defaults(fn=cmd_sweep)

    c = bsub.add_parser("compare", help="before (batch 1, no cache) vs after (defaults), in one run")
    _common(c, concurrency=128, duration=15.0, warmup=2.0)  # the default max_batch_size's worth
    _server_flags(c)
    c.add_argument("--repeat-ratio", type=_ratio, default=0.3,
                   help="share of requests repeating the hot set in the mixed load (default 0.3)")
    c.add_argument("--hot-size", type=positive(int), default=16, help="lines in the hot set (default 16)")
    c.add_argument("--rounds", type=positive(int), default=1,
                   help="repeat the four runs, before and after swapping places every other round; the "
                        "table averages them and each round's ratios are kept (default 1)")
    c.set_defaults(fn=cmd_compare)
