"""Scenario 1, overload: many concurrent keep-alive connections against one instance with a
queue of 32. No 5xx but 504; every refusal a 429 with ``Retry-After``; every request
answered; RSS growth after a warm-up under 10 %; healthy (and no slot leaked) afterwards.

CI runs a short burst (300 connections, 2 + 4 s); the issue's 2,000 connections for 60 s
run under ``-m slow`` and in ``scripts/reliability.sh``. Latency against the deadline is
reported, and asserted only in the long run: this check must not depend on the machine's
speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


async def test_short_overload_burst(main_service: rel.ServiceProcess) -> None:
    out = await rel.overload(main_service.url, main_service.pid, connections=300, duration_s=4.0,
                             warmup_s=2.0, timeout_ms=3000, strict_latency=False)
    assert out.ok, out.summary()
    assert out.sent == out.answered + out.rejected + out.failed and out.failed == 0
    assert out.statuses["429"] > 0  # it really was overloaded


@pytest.mark.slow
async def test_2000_connections_for_60_s(weights: Path) -> None:
    svc = rel.ServiceProcess({"model_path": weights, "max_queue_size": 32}, "overload").start()
    try:
        out = await rel.overload(svc.url, svc.pid, connections=2000, duration_s=60.0, warmup_s=20.0,
                                 timeout_ms=3000, strict_latency=True)
    finally:
        svc.cleanup()
    assert out.ok, out.summary()
