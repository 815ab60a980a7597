"""Scenario 1: overload (package docstring).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx

from chunlian.bench.promtext import Samples, metric
from tests.reliability.harness.common import (
    HOST,
    HOT_LINES,
    JSON_HEADERS,
    Outcome,
    ProtocolError,
    RawConn,
    ascrape,
    error_shape_problem,
    json_body,
    raise_fd_limit,
    server_errors,
    tree_rss_kb,
    upper_lines,
)

# ---- 1. overload --------------------------------------------------------------------------------


async def overload(
    url: str, pid: int | None, *, connections: int, duration_s: float, warmup_s: float,
    timeout_ms: int = 3000, late_margin_s: float = 2.0, strict_latency: bool = True,
    rss_growth_limit: float = 0.10, regenerate_share: float = 0.8, seed: int = 0,
    ramp_s: float = 1.0, idle_reconnect_s: float = 3.0,
) -> Outcome:
    """``connections`` clients, each on its own keep-alive connection, posting couplet
    requests back to back for ``warmup_s + duration_s`` seconds (a 429 makes that client wait
    its ``Retry-After``). RSS is read when the warm-up ends and after the load."""
    out = Outcome("1. overload", f"{connections} connections, {warmup_s:.0f}+{duration_s:.0f} s, "
                  f"queue 32, {int(regenerate_share * 100)}% uncached, timeout_ms={timeout_ms}")
    raise_fd_limit(connections + 512)
    port = int(url.rsplit(":", 1)[1])
    lines = upper_lines()
    rng = random.Random(seed)
    before = await ascrape(url)
    t_start = time.monotonic()
    warm_end = t_start + warmup_s
    end = warm_end + duration_s
    deadline_s = timeout_ms / 1000.0
    late: list[float] = []
    late_cached = [0]
    reconnects = [0]
    transport: Counter[str] = Counter()
    rss: dict[str, int | None] = {}
    peak = [0]
    timeline: list[int] = []  # RSS every 10 s after the warm-up
    retry_after_seen: Counter[str] = Counter()

    def body() -> bytes:
        if rng.random() < regenerate_share:
            return json_body({"upper": rng.choice(lines), "regenerate": True, "timeout_ms": timeout_ms})
        return json_body({"upper": rng.choice(HOT_LINES), "timeout_ms": timeout_ms})

    async def client(i: int) -> None:
        await asyncio.sleep(ramp_s * i / max(1, connections))  # spread the connects
        conn = RawConn(HOST, port)
        served = 0  # answers on this connection
        idle_since = time.monotonic()
        try:
            while time.monotonic() < end:
                data = body()
                if served and time.monotonic() - idle_since >= idle_reconnect_s:
                    # as HTTP clients do: never reuse a connection the server may be closing
                    # (uvicorn drops keep-alive connections idle for 5 s)
                    conn.abort()
                    served = 0
                    reconnects[0] += 1
                try:
                    reply = await conn.request("POST", "/v1/couplets", data, JSON_HEADERS,
                                               timeout_s=deadline_s + 60.0)
                except (OSError, TimeoutError, ProtocolError, asyncio.IncompleteReadError, ValueError) as e:
                    kind = f"{type(e).__name__} on a {'reused' if served else 'new'} connection"
                    transport[kind] += 1
                    out.count("failed", f"transport:{type(e).__name__}")
                    if transport[kind] <= 3:
                        out.problem(f"transport error {kind}: {e}")
                    conn.abort()
                    served = 0
                    await asyncio.sleep(0.2)
                    continue
                served += 1
                idle_since = time.monotonic()
                st = reply.status
                if st == 200:
                    out.count("answered", "200")
                    if reply.latency_s > deadline_s + late_margin_s:
                        late.append(reply.latency_s)
                        if b'"cached":true' in reply.body:
                            late_cached[0] += 1
                elif st == 429:
                    why = error_shape_problem(reply, data)
                    ra = reply.headers.get("retry-after", "")
                    retry_after_seen[ra] += 1
                    if why or not ra.isdigit() or int(ra) < 1:
                        out.count("failed", "429")
                        out.problem(f"429 without a valid Retry-After ({ra!r}) or shape: {why}")
                    else:
                        out.count("rejected", "429")
                        wait = int(ra) * (1.0 + 0.5 * rng.random())
                        await asyncio.sleep(max(0.0, min(wait, end - time.monotonic())))
                elif st == 504:
                    why = error_shape_problem(reply, data)
                    if why:
                        out.count("failed", "504")
                        out.problem(why)
                    else:
                        out.count("rejected", "504")
                else:
                    out.count("failed", str(st))
                    out.problem(f"unexpected {st}: {reply.text[:200]!r}")
        finally:
            await conn.close()

    async def sampler() -> None:
        if pid is None:
            return
        await asyncio.sleep(max(0.0, warm_end - time.monotonic()))
        rss["start_kb"] = tree_rss_kb(pid)
        next_mark = time.monotonic()
        while time.monotonic() < end:
            v = tree_rss_kb(pid)
            if v:
                peak[0] = max(peak[0], v)
                if time.monotonic() >= next_mark:
                    timeline.append(v)
                    next_mark += 10.0
            await asyncio.sleep(0.5)

    lags: list[float] = []

    async def lag_monitor() -> None:  # how late this (the client's) event loop runs
        while time.monotonic() < end:
            t = time.monotonic()
            await asyncio.sleep(0.1)
            lags.append(time.monotonic() - t - 0.1)

    samp = asyncio.create_task(sampler())
    lagmon = asyncio.create_task(lag_monitor())
    await asyncio.gather(*(client(i) for i in range(connections)))
    await samp
    await lagmon
    lags.sort()
    client_lag = (lags[int(len(lags) * 0.99)] if lags else 0.0, lags[-1] if lags else 0.0)
    load_s = time.monotonic() - t_start
    # healthy afterwards: the queue drains, /readyz is 200, a new request is answered, and
    # then no slot is left occupied (``chunlian_engine_running`` is refreshed by a step, so it
    # is read after the new request)
    drain_deadline = time.monotonic() + 60.0
    s = await ascrape(url)
    while metric(s, "chunlian_queue_depth") != 0 and time.monotonic() < drain_deadline:
        await asyncio.sleep(0.2)
        s = await ascrape(url)
    if metric(s, "chunlian_queue_depth") != 0:
        out.problem(f"the queue did not drain within 60 s after the load: depth {metric(s, 'chunlian_queue_depth'):.0f}")
    if pid is not None:
        await asyncio.sleep(1.0)
        rss["end_kb"] = tree_rss_kb(pid)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        ready = await c.get("/readyz")
        fresh = await c.post("/v1/couplets", json={"upper": "春回大地千山秀", "regenerate": True})
    if ready.status_code != 200:
        out.problem(f"/readyz after the load: {ready.status_code}")
    if fresh.status_code != 200:
        out.problem(f"a request after the load: {fresh.status_code} {fresh.text[:200]}")
    after = await ascrape(url)
    settle_deadline = time.monotonic() + 3.0  # an engine process pushes its gauges every 0.25 s
    while (metric(after, "chunlian_engine_running") != 0 or metric(after, "chunlian_queue_depth") != 0) \
            and time.monotonic() < settle_deadline:
        await asyncio.sleep(0.1)
        after = await ascrape(url)
    if metric(after, "chunlian_engine_running") != 0 or metric(after, "chunlian_queue_depth") != 0:
        out.problem(f"slots still taken after the load: running {metric(after, 'chunlian_engine_running'):.0f}, "
                    f"queued {metric(after, 'chunlian_queue_depth'):.0f}")
    errors = server_errors(after) - server_errors(before)
    if errors:
        out.problem(f"the service counted {errors:.0f} 5xx answers (504 excluded)")
    rejections = metric(after, "chunlian_overload_rejections_total") - metric(before, "chunlian_overload_rejections_total")
    out.extra.update(
        load_s=round(load_s, 1), late=len(late), transport=dict(transport), rss=rss, rss_peak_kb=peak[0],
        engine_rejections=int(rejections), retry_after=dict(retry_after_seen),
        completed=int(metric(after, "chunlian_engine_completed_total") - metric(before, "chunlian_engine_completed_total")),
        deadline_drops=int(metric(after, "chunlian_deadline_drops_total") - metric(before, "chunlian_deadline_drops_total")),
    )
    def over(samples: Samples, seconds: float) -> float:
        name = "chunlian_http_request_duration_seconds"
        return (metric(samples, f"{name}_count", endpoint="/v1/couplets")
                - metric(samples, f"{name}_bucket", endpoint="/v1/couplets", le=str(float(seconds))))

    # The promise is the service's: judged on its own clock (the middleware's histogram, from
    # the first byte the app sees to the last it sends), at the first bucket that is at least
    # deadline + margin. The client's view (this process shares the CPUs) is reported too.
    from chunlian.api.metrics import LATENCY_BUCKETS

    limit = min((b for b in LATENCY_BUCKETS if b >= deadline_s + late_margin_s), default=LATENCY_BUCKETS[-1])
    late_server = over(after, limit) - over(before, limit)
    out.extra.update(server_over_limit=late_server, late_client=len(late), late_cached=late_cached[0])
    out.note(f"client's view: {len(late)} answers of 200 ({late_cached[0]} of them cache hits) arrived later than "
             f"the deadline + {late_margin_s:.0f} s (slowest {max(late, default=0.0):.1f} s); the client's own "
             f"event-loop lag p99 {client_lag[0] * 1000:.0f} ms, max {client_lag[1] * 1000:.0f} ms; "
             f"{reconnects[0]} reconnects after idling")
    if late_server:
        msg = (f"{late_server:.0f} answers took the service more than {limit:g} s "
               f"(deadline {deadline_s:g} s + {late_margin_s:g} s) by its own clock")
        if strict_latency:
            out.problem(msg)
        else:
            out.note(msg)
    else:
        out.note(f"by the service's own clock every answer took under {limit:g} s (deadline {deadline_s:g} s + "
                 f"{late_margin_s:g} s)")
    if transport:
        out.note(f"transport errors: {dict(transport)}")
    start_kb, end_kb = rss.get("start_kb"), rss.get("end_kb")
    if pid is not None:
        if not start_kb or not end_kb:
            out.problem(f"could not read the server's RSS: {rss}")
        else:
            growth = (end_kb - start_kb) / start_kb
            out.extra["rss_growth"] = round(growth, 4)
            out.note(f"RSS of the instance (its process and its engine processes) {start_kb / 1024:.0f} MiB after warm-up -> {end_kb / 1024:.0f} MiB at the end "
                     f"({growth:+.1%}; peak {peak[0] / 1024:.0f} MiB; every 10 s: "
                     + ", ".join(f"{v / 1024:.0f}" for v in timeline) + " MiB)")
            if growth >= rss_growth_limit:
                out.problem(f"RSS grew {growth:.1%} (limit {rss_growth_limit:.0%}): {rss}")
    out.note(f"429 {out.statuses['429']}, 504 {out.statuses['504']}, engine completed "
             f"{out.extra['completed']}, Retry-After values {dict(retry_after_seen)}")
    out.seconds = time.monotonic() - t_start
    return out
