"""The quality modes served online: best and auto against fast, side by side on one server.

    python benchmarks/quality_serving.py                      # the defaults below
    python benchmarks/quality_serving.py --duration-s 20 --lone 30

One service (the defaults: engine replicas, ``CHUNLIAN_BEAM_ROWS``; the result cache off, so
every answer is generated; fresh validation lines, so nothing coalesces) is started once and
measured in phases, each ratio from numbers of the same run:

* lone: one request at a time, fast and best alternating line by line: median latency;
* closed loop at ``--concurrency`` (64): fast-only, then best-only requests/s;
* saturation at ``--saturation`` (256): fast-only, then auto: requests/s, p99, 5xx;
* light load: open-loop arrivals at ``--light-share`` (10%) of the fast closed-loop rate,
  auto: the share of answers served best.

Prints a JSON report (also written to ``runs/quality_serving-DATE-TIME.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chunlian.bench.common import percentile
from chunlian.bench.rawhttp import EXCHANGE_ERRORS, RawConnection, encode_body
from chunlian.bench.sweep import run_server
from chunlian.training.eval_run import read_eval_pairs

STYLES = ("traditional", "business", "family", "literary")


class Lines:
    """Fresh request bodies: each validation line once per style, in a shuffled order."""

    def __init__(self, uppers: list[str]) -> None:
        self.items = [(u, s) for s in STYLES for u in uppers]
        random.Random(7).shuffle(self.items)
        self.at = 0

    def body(self, quality: str) -> dict[str, Any]:
        """A fresh request; best-only load waits long for its rows, so it gets 30 s (the
        other phases keep the service's default deadline, which auto's step-down reads)."""
        upper, style = self.items[self.at % len(self.items)]
        self.at += 1
        body: dict[str, Any] = {"upper": upper, "style": style, "quality": quality}
        if quality == "best":
            body["timeout_ms"] = 30_000
        return body


class Client:
    """Connections to the server (the project's raw client: a load generator on the same
    cores must cost far less than the server it measures)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    def connect(self) -> RawConnection:
        return RawConnection(self.host, self.port, timeout_s=60.0)


async def one(conn: RawConnection, body: dict[str, Any]) -> tuple[float, int, str]:
    """(seconds, status, served) of one request; status -1 for a transport error."""
    t0 = time.perf_counter()
    try:
        status, _headers, data = await conn.request(b"POST", "/v1/couplets", encode_body(body))
    except EXCHANGE_ERRORS:
        return time.perf_counter() - t0, -1, ""
    served = json.loads(data).get("served", "") if status == 200 else ""
    return time.perf_counter() - t0, status, served


def summary(results: list[tuple[float, int, str]], took_s: float) -> dict[str, Any]:
    ok = [t for t, code, _ in results if code == 200]
    return {
        "requests": len(results), "req_per_s": round(len(ok) / took_s, 2),
        "p50_s": round(percentile(ok, 50), 3) if ok else None, "p99_s": round(percentile(ok, 99), 3) if ok else None,
        "status": dict(Counter(code for _, code, _ in results)),
        "served": dict(Counter(s for _, code, s in results if code == 200)),
        "errors_5xx": sum(1 for _, code, _ in results if code >= 500),
    }


async def once(http: Client, body: dict[str, Any]) -> tuple[float, int, str]:
    """One request on a connection of its own (open-loop arrivals)."""
    conn = http.connect()
    try:
        return await one(conn, body)
    finally:
        conn.close()


async def closed_loop(http: Client, lines: Lines, quality: str, clients: int,
                      duration_s: float) -> dict[str, Any]:
    results: list[tuple[float, int, str]] = []
    end = time.perf_counter() + duration_s

    async def client() -> None:
        conn = http.connect()
        while time.perf_counter() < end:
            results.append(await one(conn, lines.body(quality)))
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return summary(results, time.perf_counter() - t0)


async def arrivals(http: Client, make: Callable[[], dict[str, Any]], rate_per_s: float, duration_s: float,
                   seed: int = 11) -> list[tuple[float, int, str]]:
    """Poisson arrivals of ``make()`` bodies at ``rate_per_s`` for ``duration_s``, each on
    a connection of its own; every answer awaited."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[tuple[float, int, str]]] = []
    t0 = time.perf_counter()
    at = t0
    while at < t0 + duration_s:
        at += rng.expovariate(rate_per_s)
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.ensure_future(once(http, make())))
    return list(await asyncio.gather(*tasks))


async def open_loop(http: Client, lines: Lines, quality: str, rate_per_s: float,
                    duration_s: float) -> dict[str, Any]:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``; waits for every answer."""
    results = await arrivals(http, lambda: lines.body(quality), rate_per_s, duration_s)
    return {**summary(results, duration_s), "offered_per_s": round(rate_per_s, 2)}


async def lone(http: Client, lines: Lines, count: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"fast": [], "best": []}
    conn = http.connect()
    for k in range(count):
        for q in (("fast", "best") if k % 2 == 0 else ("best", "fast")):
            t, code, served = await one(conn, lines.body(q))
            if code == 200 and served == q:
                times[q].append(t)
    med = {q: statistics.median(ts) for q, ts in times.items() if ts}
    return {"median_ms": {q: round(1000 * m, 1) for q, m in med.items()}, "samples": {q: len(ts) for q, ts in times.items()},
            "best_over_fast": round(med["best"] / med["fast"], 2) if len(med) == 2 else None}


async def measure(url: str, args: argparse.Namespace, uppers: list[str]) -> dict[str, Any]:
    lines = Lines(uppers)
    http = Client(url)
    await closed_loop(http, lines, "auto", 16, args.warmup_s)  # warm both runners
    rep: dict[str, Any] = {"lone": await lone(http, lines, args.lone)}
    c = args.concurrency
    rep[f"closed_c{c}"] = {q: await closed_loop(http, lines, q, c, args.duration_s) for q in ("fast", "best")}
    s = args.saturation
    rep[f"saturation_c{s}"] = {q: await closed_loop(http, lines, q, s, args.duration_s) for q in ("fast", "auto")}
    rate = args.light_share * rep[f"closed_c{c}"]["fast"]["req_per_s"]
    await asyncio.sleep(2.0)  # the queue empties; the measured wait settles
    rep["light_auto"] = await open_loop(http, lines, "auto", rate, args.duration_s)
    closed, sat, light = rep[f"closed_c{c}"], rep[f"saturation_c{s}"], rep["light_auto"]
    answered = sum(light["served"].values()) or 1
    rep["ratios"] = {
        "best_over_fast_req_per_s": round(closed["best"]["req_per_s"] / closed["fast"]["req_per_s"], 3),
        "lone_best_over_fast_latency": rep["lone"]["best_over_fast"],
        "saturation_auto_over_fast_req_per_s": round(sat["auto"]["req_per_s"] / sat["fast"]["req_per_s"], 3),
        "saturation_auto_over_fast_p99": round(sat["auto"]["p99_s"] / sat["fast"]["p99_s"], 3),
        "saturation_5xx": sat["auto"]["errors_5xx"] + sat["fast"]["errors_5xx"],
        "light_load_best_share": round(light["served"].get("best", 0) / answered, 3),
    }
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--val", type=Path, default=Path("runs/data/val.tsv"))
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--duration-s", type=float, default=15.0)
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--lone", type=int, default=20, help="lines timed alone in each mode")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--saturation", type=int, default=256)
    ap.add_argument("--light-share", type=float, default=0.10)
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="service settings (CHUNLIAN_ names, lower case), e.g. beam_rows=32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    uppers = [u for u, _ in read_eval_pairs(args.val, args.lines)]
    settings: dict[str, object] = {"cache_size": 0, **dict(kv.split("=", 1) for kv in args.set)}
    with run_server(settings) as srv:
        rep = asyncio.run(measure(srv.url, args, uppers))
    rep["settings"] = settings
    rep["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out = args.out or Path("runs") / time.strftime("quality_serving-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps(rep, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
