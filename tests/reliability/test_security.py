"""Scenario 7, security basics, against the real service and the real Redis (db 12): body
and header limits, hashed cache keys (no user text in any Redis key name), API keys on the
bulk endpoints (jobs, batch), no stack traces or internal paths in error bodies, request ids (and never an
API key) in the service's log."""

from __future__ import annotations

import pytest

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_security_basics(main_service: rel.ServiceProcess) -> None:
    out = await rel.security(main_service, api_keys=rel.API_KEYS, redis_db=rel.SECURITY_REDIS_DB)
    assert out.ok, out.summary()
    if out.extra.get("jobs_checked"):  # this build has the job endpoints
        # jobs: no key, wrong key, status with a wrong key; batch: no key
        assert out.statuses["401"] == 4 and out.statuses["202"] == 1
    assert out.statuses["413"] == 2 and out.statuses["431"] >= 2


async def test_no_user_text_in_redis_key_names_after_fuzzing(main_service: rel.ServiceProcess) -> None:
    """After everything the other tests sent, db 12 still holds hashes only."""
    import redis

    r = redis.Redis(host=rel.HOST, port=rel.REDIS_PORT, db=rel.SECURITY_REDIS_DB, socket_timeout=5)
    try:
        names = [k.decode("utf-8", "replace") for k in r.scan_iter(count=1000)]
    finally:
        r.close()
    bad = [k for k in names if rel.HAN_RE.search(k) or (k.startswith("chunlian:v1:") and len(k) != len("chunlian:v1:") + 64)]
    assert not bad, bad[:5]
