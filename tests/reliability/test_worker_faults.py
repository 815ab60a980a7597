"""Scenario 3, worker faults (long: ``-m slow``): a Celery worker SIGKILLed in the middle of a
2,000-item job and another started, then the broker restarted mid-job; every item comes
back exactly once. Skipped, with the reason, when this build has no Celery jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def test_worker_killed_and_broker_restarted_mid_job(weights: Path, redis_up: None) -> None:
    why = rel.jobs_available()
    if why:
        pytest.skip(why)
    outs = rel.worker_fault(items=2000, job_limit_s=300, model_path=weights)
    for out in outs:
        assert out.ok and out.lost == 0, out.summary()
