"""Scenario 5: client faults - disconnects, queued deadlines, slow clients (package docstring).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

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
    upper_lines,
)
from tests.reliability.harness.services import InProcessService

# ---- 5. client faults ----------------------------------------------------------------------------


async def _poll_metrics(url: str, pred: Callable[[Samples], bool], limit_s: float, what: str) -> Samples:
    deadline = time.monotonic() + limit_s
    while True:
        s = await ascrape(url)
        if pred(s):
            return s
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


def _delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


async def _send_only(port: int, body: dict[str, Any]) -> RawConn:
    """Open a connection and send one couplet request without reading the answer."""
    conn = await RawConn(HOST, port).connect()
    data = json_body(body)
    await conn.send(conn.head("POST", "/v1/couplets", JSON_HEADERS, len(data)) + data)
    return conn


async def _hold_engine(svc: InProcessService, body: dict[str, Any]) -> RawConn:
    """Send ``body`` and return once the engine is parked right after its first step."""
    svc.hold.arm()
    conn = await _send_only(svc.port, body)
    if not await asyncio.to_thread(svc.hold.held.wait, 120):
        raise TimeoutError("the engine never stepped")
    return conn


def _distinct(lines: list[str], k: int, offset: int) -> list[str]:
    return [lines[(offset + i) % len(lines)] for i in range(k)]


async def disconnects(svc: InProcessService, *, queued: int = 8, offset: int = 0) -> Outcome:
    """``queued`` clients go away while their requests wait in the queue, and the client
    of the running request goes away mid-generation: every one is cancelled (counted in
    ``chunlian_cancelled_requests_total`` and as 499), none is prefilled, the queue empties
    and the engine carries on."""
    out = Outcome("5a. clients disconnect", f"{queued} queued + 1 running request, connections dropped")
    t0 = time.monotonic()
    url, lines = svc.url, upper_lines()
    m0 = await ascrape(url)
    conns: list[RawConn] = []
    try:
        holder = await _hold_engine(svc, {"upper": lines[offset % len(lines)], "regenerate": True})
        conns = [await _send_only(svc.port, {"upper": u, "regenerate": True})
                 for u in _distinct(lines, queued, offset + 1)]
        await _poll_metrics(url, lambda s: metric(s, "chunlian_queue_depth") == queued, 60, "the queue to fill")
        for c in [*conns, holder]:
            c.abort()
        gone = queued + 1
        await _poll_metrics(
            url, lambda s: _delta(s, m0, "chunlian_http_requests_total", endpoint="/v1/couplets", status="499") >= gone,
            60, "the server to notice every client leaving")
    finally:
        svc.hold.open()
    m1 = await _poll_metrics(url, lambda s: _delta(s, m0, "chunlian_cancelled_requests_total") >= queued + 1,
                             60, "the engine to cancel every abandoned request")
    m1 = await _poll_metrics(url, lambda s: metric(s, "chunlian_queue_depth") == 0, 60, "the queue to empty")
    for _ in range(queued + 1):
        out.count("rejected", "499 (client gone)")
    cancelled = _delta(m1, m0, "chunlian_cancelled_requests_total")
    prefills = _delta(m1, m0, "chunlian_engine_prefills_total")
    c499 = _delta(m1, m0, "chunlian_http_requests_total", endpoint="/v1/couplets", status="499")
    if cancelled != queued + 1:
        out.problem(f"cancelled counted {cancelled:.0f}, expected {queued + 1}")
    if c499 != queued + 1:
        out.problem(f"499 counted {c499:.0f}, expected {queued + 1}")
    if prefills != 1:
        out.problem(f"{prefills:.0f} prefills; only the running request should have reached the model")
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        after = await client.post("/v1/couplets",
                                  json={"upper": lines[(offset + queued + 2) % len(lines)], "regenerate": True})
    if after.status_code != 200:
        out.problem(f"a request after the disconnects: {after.status_code} {after.text[:200]}")
    m2 = await ascrape(url)
    if metric(m2, "chunlian_engine_running") != 0 or metric(m2, "chunlian_queue_depth") != 0:
        out.problem(f"slots leaked: running {metric(m2, 'chunlian_engine_running')}, "
                    f"queued {metric(m2, 'chunlian_queue_depth')}")
    out.note(f"cancelled +{cancelled:.0f}, 499 +{c499:.0f}, prefills +{prefills:.0f}")
    out.seconds = time.monotonic() - t0
    return out


async def queued_deadlines(svc: InProcessService, *, queued: int = 8, timeout_ms: int = 50, offset: int = 20) -> Outcome:
    """With the engine parked on a running request, ``queued`` requests with
    ``timeout_ms`` wait in the queue past their deadline: each is answered 504, counted in
    ``chunlian_deadline_drops_total``, and never prefilled (``chunlian_engine_prefills_total``
    counts only the running one).

    The engine's own safety timer (deadline + 1 s) would turn a drop into a cancellation if
    this machine stalled for a second between sending and releasing; then the two counters
    together must still account for every request (and the note says so)."""
    out = Outcome("5c. deadline passes while queued", f"{queued} requests with timeout_ms={timeout_ms} behind a parked engine")
    t0 = time.monotonic()
    url, lines = svc.url, upper_lines()
    m0 = await ascrape(url)
    conns: list[RawConn] = []
    try:
        holder = await _hold_engine(svc, {"upper": lines[offset % len(lines)], "regenerate": True})
        t_send = time.monotonic()
        conns = [await _send_only(svc.port, {"upper": u, "regenerate": True, "timeout_ms": timeout_ms})
                 for u in _distinct(lines, queued, offset + 1)]
        await _poll_metrics(url, lambda s: metric(s, "chunlian_queue_depth") == queued, 60, "the queue to fill")
        await asyncio.sleep(timeout_ms / 1000.0 + 0.1)  # every deadline has passed now
        t_release = time.monotonic()
    finally:
        svc.hold.open()
    replies = await asyncio.gather(*(c.read_reply(60) for c in conns), return_exceptions=True)
    held_reply = await holder.read_reply(120)
    for c in [*conns, holder]:
        await c.close()
    for r in replies:
        if isinstance(r, BaseException):
            out.count("failed", f"transport:{type(r).__name__}")
            out.problem(f"no answer: {r!r}")
        elif r.status == 504 and error_shape_problem(r) is None and r.json()["error"]["code"] == "deadline_exceeded":
            out.count("rejected", "504")
        else:
            out.count("failed", str(r.status))
            out.problem(f"expected 504 deadline_exceeded, got {r.status} {r.text[:200]}")
    out.count("answered" if held_reply.status == 200 else "failed", str(held_reply.status))
    if held_reply.status != 200:
        out.problem(f"the running request: {held_reply.status} {held_reply.text[:200]}")
    m1 = await _poll_metrics(url, lambda s: metric(s, "chunlian_queue_depth") == 0, 60, "the queue to empty")
    drops = _delta(m1, m0, "chunlian_deadline_drops_total")
    cancelled = _delta(m1, m0, "chunlian_cancelled_requests_total")
    prefills = _delta(m1, m0, "chunlian_engine_prefills_total")
    if prefills != 1:
        out.problem(f"{prefills:.0f} prefills: a request past its deadline reached the model")
    stalled = t_release - t_send >= 0.95
    if not stalled and drops != queued:
        out.problem(f"deadline drops counted {drops:.0f}, expected {queued}")
    if stalled and drops + cancelled != queued:
        out.problem(f"drops {drops:.0f} + cancellations {cancelled:.0f} != {queued}")
    out.note(f"deadline drops +{drops:.0f}, prefills +{prefills:.0f} (the running request only)"
             + (f"; the machine stalled {t_release - t_send:.2f} s, cancellations +{cancelled:.0f}" if stalled else ""))
    out.seconds = time.monotonic() - t0
    return out


async def slow_clients(url: str, *, slow: int = 50, normal: int = 20, trickle_every_s: float = 0.25,
                       limit_s: float = 120.0) -> Outcome:
    """``slow`` slowloris connections (half of them trickle their headers, half their body,
    one byte at a time) stay open while ``normal`` requests are sent: each normal request
    must be answered; then the slow ones finish their requests and get answers too."""
    out = Outcome("5b. slow clients", f"{slow} slowloris connections while {normal} normal requests run")
    port = int(url.rsplit(":", 1)[1])
    lines = upper_lines()
    normal_done = asyncio.Event()
    opened = 0
    all_open = asyncio.Event()
    t_limit = time.monotonic() + limit_s

    async def slowloris(i: int) -> None:
        nonlocal opened
        conn = await RawConn(HOST, port).connect()
        data = json_body({"upper": HOT_LINES[i % len(HOT_LINES)]})
        head = conn.head("POST", "/v1/couplets", [*JSON_HEADERS.items(), ("X-Request-Id", f"slow-{i}")], len(data))
        if i % 2 == 0:  # trickle the headers
            await conn.send(head[:20])
            rest = head[20:] + data
        else:  # headers at once, trickle the body
            await conn.send(head + data[:3])
            rest = data[3:]
        opened += 1
        if opened == slow:
            all_open.set()
        k = 0
        while not normal_done.is_set() and time.monotonic() < t_limit and k < len(rest) - 1:
            await conn.send(rest[k:k + 1])
            k += 1
            await asyncio.sleep(trickle_every_s)
        while not normal_done.is_set() and time.monotonic() < t_limit:
            await asyncio.sleep(trickle_every_s)  # the last byte waits for the normal requests
        await conn.send(rest[k:])
        try:
            r = await conn.read_reply(60)
        except (OSError, TimeoutError, ProtocolError) as e:
            out.count("failed", f"transport:{type(e).__name__}")
            out.problem(f"slow client {i}: {e!r}")
        else:
            judge = "answered" if r.status == 200 else "failed"
            out.count(judge, str(r.status))
            if r.status != 200:
                out.problem(f"slow client {i}: {r.status} {r.text[:200]}")
        finally:
            await conn.close()

    async def normals() -> None:
        await asyncio.wait_for(all_open.wait(), 60)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                for i in range(normal):
                    body = {"upper": lines[i % len(lines)], "seed": random.randrange(1 << 30)}
                    try:
                        r = await c.post("/v1/couplets", json=body)
                    except httpx.HTTPError as e:
                        out.count("failed", f"transport:{type(e).__name__}")
                        out.problem(f"normal request {i} while slow clients were open: {e!r}")
                        continue
                    out.count("answered" if r.status_code == 200 else "failed", str(r.status_code))
                    if r.status_code != 200:
                        out.problem(f"normal request {i}: {r.status_code} {r.text[:200]}")
        finally:
            normal_done.set()

    t0 = time.monotonic()
    await asyncio.gather(*(slowloris(i) for i in range(slow)), normals())
    out.seconds = time.monotonic() - t0
    return out
