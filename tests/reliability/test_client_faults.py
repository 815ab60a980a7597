"""Scenario 5, client faults, through real HTTP with the real engine. The engine is parked
by a step listener (``Hold``) while the test sets up the queue, so nothing depends on
timing: clients that go away (queued or mid-generation) are cancelled and counted, requests
whose deadline passes while queued are answered 504 and never reach the model, and
slowloris connections do not stall anyone else."""

from __future__ import annotations

import pytest

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_disconnected_clients_are_cancelled_and_counted(held_service: rel.InProcessService) -> None:
    out = await rel.disconnects(held_service, queued=6)
    assert out.ok, out.summary()
    assert out.rejected == 7


async def test_deadline_passed_while_queued_never_reaches_the_model(held_service: rel.InProcessService) -> None:
    out = await rel.queued_deadlines(held_service, queued=6, timeout_ms=50)
    assert out.ok, out.summary()
    assert out.statuses["504"] == 6 and out.statuses["200"] == 1


async def test_slow_clients_do_not_stall_others(main_service: rel.ServiceProcess) -> None:
    out = await rel.slow_clients(main_service.url, slow=40, normal=10, trickle_every_s=0.2)
    assert out.ok, out.summary()
    assert out.answered == 50
