"""Scheduler rules with plain data: no torch, no threads, explicit clock."""

from __future__ import annotations

import pytest

from chunlian.engine.scheduler import QueueFull, SchedRequest, Scheduler, SchedulerConfig, bulk_rows


def req(i: int, t: float = 0.0, n: int = 1, prio: str = "interactive", deadline: float = 100.0) -> SchedRequest:
    return SchedRequest(i, prio, n, t, deadline)  # type: ignore[arg-type]


def sched(**kw: object) -> Scheduler:
    cfg = dict(max_batch_size=4, max_wait_ms=10.0, max_queue_size=100, batching="continuous")
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))  # type: ignore[arg-type]


def test_idle_engine_waits_max_wait_for_companions() -> None:
    s = sched()
    s.add(req(1, t=0.0))
    p = s.plan(0.001)
    assert p.prefill == [] and not p.decode
    assert p.idle_wait_s == pytest.approx(0.009)
    s.add(req(2, t=0.002))
    assert s.plan(0.005).prefill == []
    assert s.plan(0.0101).prefill == [1, 2]


def test_full_batch_starts_without_waiting() -> None:
    s = sched()
    for i in range(5):
        s.add(req(i))
    p = s.plan(0.0)
    assert p.prefill == [0, 1, 2, 3]  # capped at max_batch_size
    assert not p.decode  # newcomers get their first token from prefill
    assert s.queue_depth == 1


def test_continuous_joins_at_next_step_and_finished_leave_at_once() -> None:
    s = sched()
    for i in range(4):
        s.add(req(i))
    s.plan(1.0)
    s.add(req(9, t=1.0))
    p = s.plan(1.0)
    assert p.prefill == [] and p.decode  # no free slot yet
    assert s.on_seqs_finished(2, 1)
    p = s.plan(1.0)
    assert p.prefill == [9] and p.decode  # joins the running batch at once, no max wait


def test_static_mode_admits_only_when_batch_is_empty() -> None:
    s = sched(batching="static")
    for i in range(4):
        s.add(req(i))
    s.plan(1.0)
    s.add(req(9, t=1.0))
    s.on_seqs_finished(0, 1)
    assert s.plan(1.0).prefill == []
    for i in (1, 2, 3):
        s.on_seqs_finished(i, 1)
    assert s.plan(2.0).prefill == [9]


def test_expired_waiting_requests_never_reach_the_model() -> None:
    s = sched()
    s.add(req(1, deadline=0.5))
    s.add(req(2, deadline=5.0))
    p = s.plan(1.0)
    assert p.expired == [1]
    assert p.prefill == [2]


def test_waiting_requests_expire_and_cancel_at_the_first_plan_after_it_happens() -> None:
    """A plan scans the queue only when a waiting request was cancelled or reached its
    deadline; the deadlines of requests admitted meanwhile neither hide nor fake one."""
    s = sched(max_batch_size=1)
    s.add(req(1, deadline=2.0))  # admitted: its deadline passing later expires nothing
    s.add(req(2, deadline=3.0))
    s.add(req(3, deadline=50.0))
    assert s.plan(1.0).prefill == [1]
    assert s.on_seqs_finished(1, 1)
    s.cancel(1)  # no longer known: ignored
    s.add(req(4, deadline=60.0))
    s.cancel(3)
    p = s.plan(2.5)  # 1's deadline has passed, 2's has not
    assert p.expired == [] and p.cancelled == [3] and p.prefill == [2]
    s.fail_running(2)
    p = s.plan(2.6)
    assert p.prefill == [4] and p.expired == p.cancelled == []
    s.add(req(5, deadline=4.0))
    assert s.plan(3.9).expired == []
    assert s.plan(4.0).expired == [5]
    assert s.queue_depth == 0


def test_running_request_past_deadline_is_released() -> None:
    s = sched()
    s.add(req(1, n=2, deadline=2.0))
    assert s.plan(1.0).prefill == [1]
    p = s.plan(3.0)
    assert p.release == [1]
    assert s.live_seqs == 0


def test_cancel_waiting_and_running() -> None:
    s = sched(max_batch_size=1)
    s.add(req(1))
    s.add(req(2))
    assert s.plan(1.0).prefill == [1]
    s.cancel(2)
    s.cancel(1)
    p = s.plan(1.0)
    assert p.cancelled == [2] and p.release == [1]
    assert s.live_seqs == 0 and s.queue_depth == 0


def test_interactive_first_and_bulk_keeps_its_minimum_share() -> None:
    s = sched(max_batch_size=8, bulk_min_share=0.25)
    for i in range(10):
        s.add(req(100 + i, prio="bulk"))
    for i in range(10):
        s.add(req(i))
    p = s.plan(1.0)
    # interactive gets 8 - 2 reserved slots; bulk gets its 2 (25 %) even under interactive load
    assert p.prefill == [0, 1, 2, 3, 4, 5, 100, 101]


def test_bulk_keeps_to_its_share_beside_interactive_work_and_fills_an_idle_engine() -> None:
    s = sched(max_batch_size=8, bulk_min_share=0.25)
    s.add(req(1))
    for i in range(10):
        s.add(req(100 + i, prio="bulk"))
    assert s.plan(1.0).prefill == [1, 100, 101]  # interactive runs: bulk holds its 2 rows
    assert s.plan(1.1).prefill == []  # and no more while it runs, with 5 rows free
    s.on_seqs_finished(1, 1)
    s.on_seqs_finished(100, 1)
    s.on_seqs_finished(101, 1)
    assert s.plan(1.2).prefill == [102 + i for i in range(8)]  # no interactive work: all rows
    s.add(req(2))
    s.add(req(3))
    assert s.plan(1.3).prefill == []  # bulk over its share finishes first; nothing is preempted
    for i in range(6):
        s.on_seqs_finished(102 + i, 1)
    assert s.plan(1.4).prefill == [2, 3]  # interactive joins: 2 bulk rows and 2 interactive
    assert (s.live_seqs, s.live_bulk_seqs) == (4, 2)


def test_bulk_is_never_starved() -> None:
    s = sched(max_batch_size=4, bulk_min_share=0.0)
    s.add(req(100, prio="bulk"))
    for i in range(4):
        s.add(req(i))
    p = s.plan(1.0)
    assert 100 not in p.prefill  # with share 0 bulk only fills leftovers...
    s2 = sched(max_batch_size=4, bulk_min_share=0.1)
    s2.add(req(100, prio="bulk"))
    for i in range(4):
        s2.add(req(i))
    assert 100 in s2.plan(1.0).prefill  # ...any positive share guarantees at least one slot


def test_multi_candidate_requests_are_admitted_whole() -> None:
    s = sched(max_batch_size=4)
    s.add(req(1, n=3))
    s.add(req(2, n=2))
    p = s.plan(1.0)
    assert p.prefill == [1]  # 2 needs 2 slots, only 1 free: FIFO, no overtaking
    assert not s.on_seqs_finished(1, 2)
    assert s.on_seqs_finished(1, 1)
    assert s.plan(1.0).prefill == [2]


def test_queue_bound_and_oversized_requests() -> None:
    s = sched(max_queue_size=2)
    s.add(req(1))
    s.add(req(2))
    with pytest.raises(QueueFull):
        s.add(req(3))
    with pytest.raises(ValueError, match="slots"):
        sched().add(req(4, n=5))


def test_newcomers_join_a_running_batch_in_groups() -> None:
    """With a batch running, newcomers wait until ``min_prefill_seqs`` of them fit (or all
    that wait do): one prefill forward for the group instead of one per step."""
    s = sched(max_batch_size=8, max_wait_ms=0.0, min_prefill_seqs=3)
    for i in range(8):
        s.add(req(i))
    assert s.plan(0.0).prefill == list(range(8))
    for i in range(8, 12):
        s.add(req(i))
    assert s.on_seqs_finished(0, 1) and s.on_seqs_finished(1, 1)
    p = s.plan(0.1)
    assert p.prefill == [] and p.decode  # 2 free slots < group of 3: decode only
    assert s.on_seqs_finished(2, 1)
    assert s.plan(0.2).prefill == [8, 9, 10]  # 3 free: the group joins together
    assert s.on_seqs_finished(3, 1)
    assert s.plan(0.3).prefill == [11]  # fewer waiting than the group: all of them join


def test_prefill_group_defaults_to_an_eighth_of_the_batch() -> None:
    assert SchedulerConfig(max_batch_size=64).prefill_group == 8
    assert SchedulerConfig(max_batch_size=4).prefill_group == 1
    assert SchedulerConfig(max_batch_size=64, min_prefill_seqs=1).prefill_group == 1
    assert SchedulerConfig(max_batch_size=4, min_prefill_seqs=100).prefill_group == 4
    with pytest.raises(ValueError, match="min_prefill_seqs"):
        SchedulerConfig(min_prefill_seqs=-1)


@pytest.mark.parametrize(("rows", "share", "expected"), [
    (128, 0.125, 16), (64, 0.125, 8), (4, 0.125, 1), (1, 0.5, 1), (128, 0.0, 0), (10, 1.0, 10), (10, 0.25, 2),
])
def test_bulk_rows_is_the_share_rounded_down_and_at_least_one_unless_zero(rows: int, share: float,
                                                                           expected: int) -> None:
    assert bulk_rows(rows, share) == expected
