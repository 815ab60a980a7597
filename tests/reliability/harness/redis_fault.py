"""Scenario 2: Redis stopped and restarted under steady load (package docstring).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import httpx

from chunlian.bench.promtext import metric
from tests.reliability.harness.common import (
    HOT_LINES,
    Outcome,
    ascrape,
    server_errors,
    upper_lines,
)
from tests.reliability.harness.services import start_redis, stop_redis

# ---- 2. Redis faults ------------------------------------------------------------------------------


async def redis_fault(
    url: str, *, clients: int = 8, before_s: float | None = None, before_n: int = 40,
    outage_s: float | None = None, outage_n: int = 80, after_s: float | None = None,
    after_n: int = 80, recover_limit_s: float = 60.0, seed: int = 1,
) -> Outcome:
    """Steady load (``clients`` back-to-back clients: mostly a hot set of cacheable lines,
    some fresh seeded lines) on a service whose only cache is Redis; Redis is shut down
    after the first phase and started again after the second (always, even on error).

    Each phase lasts ``*_s`` seconds when given, else until ``*_n`` requests were answered.
    The third phase starts once the service says Redis is up again (bounded)."""
    stopped_for = f"{outage_s:.0f} s" if outage_s else f"for {outage_n} requests"
    load = f"{clients} clients; Redis stopped {stopped_for}, then restarted"
    out = Outcome("2. Redis stopped and restarted", load)
    rng = random.Random(seed)
    lines = upper_lines()
    stop = asyncio.Event()
    phase = ["before"]
    per_phase: Counter[str] = Counter()
    t0 = time.monotonic()

    def body() -> dict[str, Any]:
        if rng.random() < 0.8:
            return {"upper": rng.choice(HOT_LINES)}
        return {"upper": rng.choice(lines), "seed": rng.randrange(1 << 30)}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            while not stop.is_set():
                b = body()
                try:
                    r = await c.post("/v1/couplets", json=b)
                except httpx.HTTPError as e:
                    out.count("failed", f"transport:{type(e).__name__}")
                    out.problem(f"{phase[0]}: transport error {type(e).__name__}: {e}")
                    continue
                per_phase[phase[0]] += 1
                if r.status_code == 200:
                    out.count("answered", "200")
                elif r.status_code == 429:  # not a failure of the cache path; reported
                    out.count("rejected", "429")
                else:
                    out.count("failed", str(r.status_code))
                    out.problem(f"{phase[0]}: {r.status_code} {r.text[:200]}")

    async def until(seconds: float | None, answered: int, name: str) -> None:
        start_n = per_phase[name]
        deadline = time.monotonic() + (seconds if seconds is not None else 300.0)
        while time.monotonic() < deadline:
            if seconds is None and per_phase[name] - start_n >= answered:
                return
            if not tasks or all(t.done() for t in tasks):
                return
            await asyncio.sleep(0.05)

    m0 = await ascrape(url)
    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    bypass_seen = False
    try:
        await until(before_s, before_n, "before")
        try:
            await asyncio.to_thread(stop_redis)
            phase[0] = "outage"
            await until(outage_s, outage_n, "outage")
            m_out = await ascrape(url)
            errors = (metric(m_out, "chunlian_cache_requests_total", store="redis", result="error")
                      - metric(m0, "chunlian_cache_requests_total", store="redis", result="error"))
            redis_up = metric(m_out, "chunlian_redis_up")
            bypass_seen = errors > 0 or redis_up == 0
            out.note(f"during the outage: redis errors counted {errors:.0f}, chunlian_redis_up {redis_up:.0f}")
        finally:
            await asyncio.to_thread(start_redis)
        phase[0] = "after"
        m_restart = await ascrape(url)
        deadline = time.monotonic() + recover_limit_s
        while metric(await ascrape(url), "chunlian_redis_up") != 1:
            if time.monotonic() > deadline:
                out.problem(f"the service did not report Redis up within {recover_limit_s:.0f} s of the restart")
                break
            await asyncio.sleep(0.2)
        m_up = await ascrape(url)
        await until(after_s, after_n, "after")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    m1 = await ascrape(url)
    hits_after = (metric(m1, "chunlian_cache_requests_total", store="redis", result="hit")
                  - metric(m_up, "chunlian_cache_requests_total", store="redis", result="hit"))
    if not bypass_seen:
        out.problem("the cache bypass was not counted (no redis error counted, chunlian_redis_up never 0)")
    if hits_after <= 0:
        out.problem("no Redis hit after the restart")
    if server_errors(m1) - server_errors(m0) > 0:
        out.problem("the service counted 5xx answers")
    restart_hits = (metric(m_up, "chunlian_cache_requests_total", store="redis", result="hit")
                    - metric(m_restart, "chunlian_cache_requests_total", store="redis", result="hit"))
    out.note(f"requests by phase {dict(per_phase)}; Redis hits after the restart {hits_after + restart_hits:.0f}")
    out.extra.update(per_phase=dict(per_phase), hits_after=hits_after)
    out.seconds = time.monotonic() - t0
    return out
