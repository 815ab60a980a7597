"""Bulk jobs as Prometheus gauges: the backlog, read from the job store.

Items are recorded by whoever runs them (Celery workers in other processes, or the embedded
runner), so an instance cannot count them as they happen; it can read the store, which every
instance shares in Celery mode. ``JobsMonitor.run`` reads the newest jobs every
``every_s`` (a scrape never waits on Redis) and keeps a snapshot; ``collect`` exports it:

* ``chunlian_jobs{status="queued"|"running"}``: jobs with work left;
* ``chunlian_job_items_pending``: their items without a result (the backlog);
* ``chunlian_job_items_finished``: items with a result among the newest jobs, which rises
  as bulk work progresses (it can step down when an old job leaves the newest ``WATCHED_JOBS``);
* ``chunlian_jobs_monitor_ok``: 1 when the last read succeeded (0: the store is unreachable,
  and the gauges above are as of the last good read).

Every instance of a Celery cluster exports the same figures: aggregate with ``max``. The
alert ``ChunlianJobBacklogStuck`` fires when a backlog has waited 30 minutes with no item
finished (workers down, or starved by interactive load).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chunlian.jobs.store import JobState

log = logging.getLogger("chunlian.jobs")

WATCHED_JOBS = 1000  # the newest jobs read each time (older ones are long finished in practice)
ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class JobsSnapshot:
    queued: int = 0
    running: int = 0
    pending_items: int = 0
    finished_items: int = 0


def snapshot(states: Iterable[JobState]) -> JobsSnapshot:
    """The backlog of ``states``: jobs with work left and their items without a result, and
    the items with one."""
    queued = running = pending = finished = 0
    for st in states:
        finished += st.done + st.failed + st.cancelled
        status = st.status
        if status not in ACTIVE:
            continue
        queued += status == "queued"
        running += status == "running"
        pending += st.total - st.done - st.failed - st.cancelled
    return JobsSnapshot(queued, running, pending, finished)


class JobsMonitor(Collector):
    """Reads the store in the background (``run``); exports the last snapshot at scrape time."""

    def __init__(self, recent: Callable[[int], Awaitable[list[JobState]]], every_s: float) -> None:
        self.recent = recent
        self.every_s = every_s
        self.last = JobsSnapshot()
        self.ok = True

    async def refresh(self) -> None:
        """One read of the store (a failure keeps the last snapshot and says so, once)."""
        try:
            states = await self.recent(WATCHED_JOBS)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a store outage must not end the monitor
            if self.ok:
                log.warning("job metrics: the job store is unreachable (%s: %s); gauges hold their last values",
                            type(e).__name__, e)
            self.ok = False
            return
        if not self.ok:
            log.info("job metrics: the job store answers again")
        self.ok = True
        self.last = snapshot(states)

    async def run(self) -> None:
        """Refresh every ``every_s`` until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.every_s)

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily("chunlian_jobs", "Bulk jobs with work left, by status.", labels=["status"])
        jobs.add_metric(["queued"], float(self.last.queued))
        jobs.add_metric(["running"], float(self.last.running))
        yield jobs
        yield GaugeMetricFamily("chunlian_job_items_pending",
                                "Items of unfinished bulk jobs without a result yet (the backlog).",
                                value=float(self.last.pending_items))
        yield GaugeMetricFamily("chunlian_job_items_finished",
                                "Items with a result among the newest bulk jobs (rises with progress).",
                                value=float(self.last.finished_items))
        yield GaugeMetricFamily("chunlian_jobs_monitor_ok", "1 when the last read of the job store succeeded.",
                                value=1.0 if self.ok else 0.0)
