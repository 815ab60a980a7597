"""Job gauges on /metrics (``jobs.monitor``): the backlog and progress of bulk jobs read from
the job store in the background, kept through a store outage, never read during a scrape."""

from __future__ import annotations

import asyncio
import re

from chunlian.jobs.monitor import JobsMonitor, JobsSnapshot, snapshot
from chunlian.jobs.store import JobState
from tests.unit.api_fakes import FakeEngine, running_app


def test_snapshot_counts_the_backlog_of_unfinished_jobs_and_every_finished_item() -> None:
    states = [
        JobState("q", total=5),  # queued: 5 pending
        JobState("r", total=10, done=3, failed=1, started_at=1.0),  # running: 6 pending
        JobState("d", total=4, done=4, finished_at=2.0),  # done
        JobState("c", total=6, done=1, cancelled=5, cancel_requested=True, finished_at=2.0),  # cancelled
    ]
    assert snapshot(states) == JobsSnapshot(queued=1, running=1, pending_items=11, finished_items=14)
    assert snapshot([]) == JobsSnapshot()


async def test_a_store_outage_keeps_the_last_snapshot_and_says_so() -> None:
    answers: list[object] = [[JobState("r", total=3, done=1, started_at=1.0)], RuntimeError("redis down"), []]

    async def recent(limit: int) -> list[JobState]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a  # type: ignore[return-value]

    m = JobsMonitor(recent, every_s=60)
    await m.refresh()
    assert m.ok and m.last.pending_items == 2
    await m.refresh()
    assert not m.ok and m.last.pending_items == 2  # held, and flagged
    values = {f.name: f.samples for f in m.collect()}
    assert values["chunlian_jobs_monitor_ok"][0].value == 0.0
    await m.refresh()
    assert m.ok and m.last == JobsSnapshot()


def _gauge(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


async def test_metrics_show_a_held_job_as_backlog_then_as_finished() -> None:
    engine = FakeEngine()
    engine.hold = asyncio.Event()  # items wait until released
    async with running_app(engine, broker_url="", jobs_metrics_every_s=0.05) as h:
        r = await h.client.post("/v1/jobs", json={"items": [{"upper": f"春回大地{c}山秀"} for c in "一二三四"]})
        job_id = r.json()["job_id"]

        async def metrics() -> str:
            await asyncio.sleep(0.15)  # a refresh or two
            return (await h.client.get("/metrics")).text

        text = await metrics()
        assert _gauge(text, "chunlian_job_items_pending") == 4
        assert _gauge(text, 'chunlian_jobs{status="queued"}') + _gauge(text, 'chunlian_jobs{status="running"}') == 1
        assert _gauge(text, "chunlian_jobs_monitor_ok") == 1
        engine.hold.set()
        for _ in range(100):
            if (await h.client.get(f"/v1/jobs/{job_id}")).json()["status"] == "done":
                break
            await asyncio.sleep(0.02)
        text = await metrics()
        assert _gauge(text, "chunlian_job_items_pending") == 0 and _gauge(text, "chunlian_job_items_finished") == 4
