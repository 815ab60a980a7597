"""Scenario 2, Redis faults: Redis shut down under steady load and started again (always,
in ``finally``). No request fails, the bypass is counted in the metrics, and Redis hits
resume after the restart. CI's version is bounded by request counts, not time; the long
one (10 s outage) runs under ``-m slow``."""

from __future__ import annotations

import pytest

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_short_redis_stop_and_start(main_service: rel.ServiceProcess) -> None:
    out = await rel.redis_fault(main_service.url, clients=6, before_n=30, outage_n=60, after_n=60)
    assert out.ok, out.summary()
    assert out.failed == 0 and out.extra["hits_after"] > 0
    assert rel.redis_pings()


@pytest.mark.slow
async def test_redis_down_10_s_under_load(main_service: rel.ServiceProcess) -> None:
    out = await rel.redis_fault(main_service.url, clients=16, before_s=10.0, outage_s=10.0, after_s=10.0)
    assert out.ok, out.summary()
