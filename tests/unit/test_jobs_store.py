"""The job store's rules, in memory (the Redis store is held to the same tests in
tests/integration/test_jobs_store_redis.py): first write wins, counters move with writes,
cancel marks what has not run, status is derived, results page, entries expire."""

from __future__ import annotations

from typing import Any

import pytest

from chunlian.jobs.items import CANCELLED_ENTRY, failed_entry
from chunlian.jobs.store import MAX_RESULTS_PAGE, JobState, JobStore, MemoryJobStore

DONE = {"status": "done", "upper": "春回大地千山秀", "lower": "福满人间万户新", "hengpi": "万象更新",
        "style": "traditional", "model": "m@1"}


def check_store_contract(store: JobStore, p: str = "") -> None:
    """Shared by the memory and the Redis store (``p`` prefixes the job ids)."""
    j1, j2, j3, nope = f"{p}j1", f"{p}j2", f"{p}j3", f"{p}nope"
    store.create(j1, 5)
    st = store.state(j1)
    assert st is not None and st.status == "queued" and st.total == 5 and st.finished_at is None
    assert store.begin_attempt(j1, [0, 1]) == {0: 1, 1: 1}
    assert store.state(j1).status == "running"  # type: ignore[union-attr]
    assert store.record(j1, [(0, DONE), (1, failed_entry("model_error", "x"))]) == 2
    # a redelivered item never counts twice, whatever it says the second time
    assert store.record(j1, [(0, DONE), (1, DONE), (0, failed_entry("x", "y"))]) == 0
    assert store.missing(j1, [0, 1, 2, 3, 4]) == [2, 3, 4]
    st = store.state(j1)
    assert (st.done, st.failed, st.cancelled) == (1, 1, 0)  # type: ignore[union-attr]
    assert store.begin_attempt(j1, [1]) == {1: 2}
    assert store.tries(j1) == {0: 1, 1: 2}
    assert store.tries(j1, [1, 2]) == {1: 2} and store.tries(j1, []) == {}
    page = store.results(j1, 0, 3)
    assert [r["index"] for r in page] == [0, 1, 2]
    assert page[0] == {"index": 0, **DONE}
    assert page[1]["status"] == "failed" and page[1]["error"]["code"] == "model_error"
    assert page[2] == {"index": 2, "status": "pending"}
    assert store.results(j1, 4, 10) == [{"index": 4, "status": "pending"}]
    assert store.results(j1, 9, 10) == [] and store.results(j1, 0, 0) == []
    # cancel: everything without a result is cancelled, at once
    assert not store.is_cancelled(j1)
    st = store.cancel(j1)
    assert st is not None and st.status == "cancelled" and st.cancelled == 3 and st.finished
    assert store.is_cancelled(j1)
    assert store.record(j1, [(3, DONE)]) == 0  # an item finishing after the cancel is dropped
    assert store.state(j1).done == 1  # type: ignore[union-attr]
    # a finished job is not cancelled
    store.create(j2, 2)
    store.record(j2, [(0, DONE), (1, DONE)])
    st = store.state(j2)
    assert st is not None and st.status == "done" and st.finished_at is not None
    st = store.cancel(j2)
    assert st is not None and st.status == "done" and st.cancelled == 0
    # all failed: the job failed
    store.create(j3, 1)
    store.record(j3, [(0, failed_entry("item_failed", "boom"))])
    assert store.state(j3).status == "failed"  # type: ignore[union-attr]
    # the newest jobs first, with their states
    newest = store.recent(3)
    assert [s.job_id for s in newest] == [j3, j2, j1]
    assert [s.status for s in newest] == ["failed", "done", "cancelled"]
    assert [s.job_id for s in store.recent(1)] == [j3]
    # unknown jobs
    assert store.state(nope) is None and store.cancel(nope) is None
    assert store.record(nope, [(0, DONE)]) == 0 and store.results(nope, 0, 10) == []


def test_memory_store_contract() -> None:
    check_store_contract(MemoryJobStore(ttl_s=3600))


def test_memory_store_expires_idle_jobs() -> None:
    now = [1000.0]
    store = MemoryJobStore(ttl_s=60, clock=lambda: now[0])
    store.create("a", 2)
    now[0] += 50
    store.record("a", [(0, DONE)])  # activity refreshes the TTL
    now[0] += 50
    assert store.state("a") is not None
    now[0] += 61
    assert store.state("a") is None and store.results("a", 0, 10) == []
    assert store.recent(10) == []


def test_record_rejects_entries_without_an_outcome() -> None:
    store = MemoryJobStore(ttl_s=60)
    store.create("a", 1)
    with pytest.raises(ValueError):
        store.record("a", [(0, {"status": "pending"})])
    assert store.record("a", [(0, CANCELLED_ENTRY)]) == 1


def test_out_of_range_indices_are_ignored_and_pages_are_capped() -> None:
    store = MemoryJobStore(ttl_s=60)
    store.create("a", 2000)
    assert store.record("a", [(2000, DONE), (-1, DONE)]) == 0
    assert len(store.results("a", 0, 5000)) == MAX_RESULTS_PAGE


@pytest.mark.parametrize(("kw", "status"), [
    ({}, "queued"), ({"started_at": 1.0}, "running"), ({"done": 1}, "running"),
    ({"done": 2}, "done"), ({"done": 1, "failed": 1}, "done"), ({"failed": 2}, "failed"),
    ({"cancel_requested": True, "done": 2}, "cancelled"),
])
def test_status_is_derived(kw: dict[str, Any], status: str) -> None:
    assert JobState("j", 2, **kw).status == status
    body = JobState("j", 2, **kw).as_dict()
    assert set(body["progress"]) == {"done", "failed", "cancelled", "total"}
