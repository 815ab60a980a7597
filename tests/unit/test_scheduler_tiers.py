"""The quality modes in the scheduler: the search pool, ``auto``'s step-down and ``best``'s
refusal, with plain data and an explicit clock."""

from __future__ import annotations

import pytest

from chunlian.engine.scheduler import SchedRequest, Scheduler, SchedulerConfig, Unreachable
from chunlian.engine.tiers import StepDown
from chunlian.types import Served


def req(i: int, tier: Served | None, t: float = 0.0, n: int = 1, prio: str = "interactive",
        deadline: float = 10.0) -> SchedRequest:
    return SchedRequest(i, prio, n, t, deadline, tier=tier)  # type: ignore[arg-type]


def sched(**kw: object) -> Scheduler:
    cfg: dict[str, object] = dict(max_batch_size=8, max_wait_ms=0.0, max_queue_size=100, batching="continuous",
                                  beam_rows=64, min_prefill_seqs=1, step_down=StepDown(0.02))
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))  # type: ignore[arg-type]


def test_auto_is_best_while_nothing_waits() -> None:
    s = sched()
    s.add(req(1, None))
    p = s.plan(0.0)
    assert p.prefill == [1] and p.tiers == {1: "best"}
    assert s.live_search_rows == 32 and s.live_seqs == 0


def test_auto_steps_down_to_a_narrower_search_then_greedy_as_search_rows_fill() -> None:
    s = sched(beam_rows=40)  # one best search (32) and one good one (8)
    for i in range(3):
        s.add(req(i, None))
    p = s.plan(0.0)
    assert p.tiers == {0: "best", 1: "good", 2: "fast"}
    assert (s.live_search_rows, s.live_seqs) == (40, 1)


def test_auto_steps_down_when_the_measured_queue_wait_grows() -> None:
    s = sched()
    for i in range(16):  # 8 main rows: the second 8 wait 0.5 s
        s.add(req(i, "fast"))
    s.plan(0.0)
    for i in range(8):
        s.on_seqs_finished(i, 1, now_s=0.5)
    s.add(req(99, None, t=0.5, deadline=10.5))
    p = s.plan(0.5)
    assert p.prefill == list(range(8, 16)) and not p.tiers  # no main row left: 99 waits, undecided
    # the measured wait (0.42 s, recent admissions) is above 4% of the 10 s timeout
    assert s.wait_s == pytest.approx(0.5 * (1 - 0.8 ** 8))
    for i in range(8, 16):
        s.on_seqs_finished(i, 1, now_s=0.6)
    assert s.plan(0.6).tiers == {99: "fast"}


def test_auto_skips_a_search_whose_service_time_exceeds_the_deadline() -> None:
    s = sched()
    s.service_s.update(best=2.0, good=0.5)
    s.add(req(1, None, deadline=1.0))
    assert s.plan(0.0).tiers == {1: "good"}


def test_a_waiting_best_search_does_not_hold_up_greedy_requests_behind_it() -> None:
    s = sched(beam_rows=32)
    s.add(req(1, "best"))
    s.add(req(2, "best"))  # no rows left in the search pool
    s.add(req(3, "fast"))
    s.add(req(4, None))  # behind a waiting search: not searched ahead of it
    p = s.plan(0.0)
    assert p.prefill == [1, 3, 4] and p.tiers == {4: "fast"}
    assert [r.req_id for r in s.waiting["interactive"]] == [2]
    s.on_seqs_finished(1, 32, now_s=0.5)
    assert s.plan(0.5).prefill == [2]
    assert s.service_s["best"] == pytest.approx(0.5)


def test_best_is_refused_when_the_measured_service_time_misses_its_deadline() -> None:
    s = sched(beam_rows=32)
    s.service_s["best"] = 1.0
    s.add(req(1, "best", deadline=5.0))
    s.plan(0.0)
    s.add(req(2, "best", deadline=5.0))  # starts after 1: done at about 2 s
    with pytest.raises(Unreachable):  # would start after 1 and 2: done at about 3 s
        s.add(req(3, "best", deadline=2.5))
    s.add(req(4, "fast", deadline=0.1))  # greedy is never refused this way


def test_bulk_searches_keep_to_the_bulk_share_beside_interactive_work() -> None:
    s = sched(beam_rows=96, bulk_min_share=0.125)
    s.add(req(1, "fast"))
    for i in range(2, 5):
        s.add(req(i, "best", prio="bulk"))
    p = s.plan(0.0)
    # beside interactive work: one search of the share's width (a good one, and it says so)
    assert p.prefill == [1, 2] and p.tiers == {2: "good"}
    assert s.live_search_rows == 8
    s.on_seqs_finished(1, 1, now_s=0.1)
    p = s.plan(0.1)
    assert p.prefill == [3, 4] and p.tiers == {}  # alone, bulk searches at full width


def test_without_a_search_pool_searches_share_the_main_rows() -> None:
    s = sched(beam_rows=0, max_batch_size=40)
    s.add(req(1, "best"))
    s.add(req(2, "fast", n=8))
    s.plan(0.0)
    assert s.live_seqs == 40 and s.live_search_rows == 0


def test_auto_gets_no_search_while_more_rows_wait_than_are_free() -> None:
    s = sched()  # 8 main rows
    for i in range(12):  # a saturating load: 12 rows asked for, 8 free
        s.add(req(i, None))
    p = s.plan(0.0)
    assert set(p.tiers.values()) == {"fast"} and len(p.tiers) == 8
    for i in range(8):
        s.on_seqs_finished(i, 1, now_s=0.05)
    p = s.plan(0.05)  # the 4 left fit: no backlog, a short wait
    assert p.tiers == {8: "best", 9: "best", 10: "fast", 11: "fast"}


def test_auto_gets_no_search_while_a_quarter_of_the_main_rows_are_live() -> None:
    """A closed-loop peak admits everything at once (no wait, no backlog), yet its greedy rows
    keep the cores busy: from ``busy_share`` of the main rows live, auto is fast."""
    s = sched(max_batch_size=16)  # busy from 4 live rows
    for i in range(3):
        s.add(req(i, "fast"))
    s.plan(0.0)
    s.add(req(10, None))
    assert s.plan(0.0).tiers == {10: "best"}  # 3 of 16 live
    s.add(req(11, "fast"))
    s.plan(0.0)
    s.add(req(12, None))
    assert s.plan(0.0).tiers == {12: "fast"}  # 4 of 16 live
    with pytest.raises(ValueError, match="busy_share"):
        StepDown(0.02, busy_share=0.0)


def test_a_bulk_search_kept_out_of_the_search_pool_steps_down_to_fast_after_a_bounded_wait() -> None:
    """Steady interactive best demand fills the search pool; a bulk best item waits at most a
    quarter of its timeout, then is written greedily in the main pool (where bulk has its
    floor) and says so, instead of waiting until its deadline."""
    s = sched(beam_rows=64)
    left: dict[int, int] = {}
    ids = iter(range(1000, 100_000))
    s.add(req(1, "best", prio="bulk", deadline=10.0))
    admitted_at, tier = None, None
    for k in range(200):
        now = k * 0.1
        while sum(1 for r in s.waiting["interactive"]) < 3:  # more best demand than the pool holds
            s.add(req(next(ids), "best", t=now, deadline=now + 10.0))
        plan = s.plan(now)
        assert 1 not in plan.expired
        for i in plan.prefill:
            left[i] = 5
            if i == 1:
                admitted_at, tier = now, plan.tiers.get(1, "best")
        for i in list(left):
            left[i] -= 1
            if left[i] == 0:
                del left[i]
                s.on_seqs_finished(i, s.running[i].remaining, now)
        if admitted_at is not None:
            break
    assert admitted_at is not None and admitted_at <= 2.5 + 0.1 and tier == "fast"
    assert s.live_search_rows == 64  # the interactive searches kept the whole pool


def test_a_bulk_search_past_its_time_estimate_is_queued_not_refused() -> None:
    s = sched(beam_rows=32)
    s.service_s["best"] = 1.0
    s.add(req(1, "best", deadline=5.0))
    s.plan(0.0)
    s.add(req(2, "best", prio="bulk", deadline=1.5))  # would be Unreachable at interactive priority
    assert [r.req_id for r in s.waiting["bulk"]] == [2]


def test_bulk_searches_behind_bulk_searches_alone_wait_their_turn_at_full_width() -> None:
    s = sched(beam_rows=64)
    for i in range(8):
        s.add(req(i, "best", prio="bulk", deadline=60.0))
    served: dict[int, str] = {}
    started: dict[int, float] = {}
    for k in range(40):
        now = k * 1.0  # each search takes 3 s: the last pair waits 9 s, past the 5 s bound
        for i in [i for i, t in started.items() if now - t >= 3.0 and i in s.running]:
            s.on_seqs_finished(i, s.running[i].remaining, now)
        plan = s.plan(now)
        for i in plan.prefill:
            served[i], started[i] = plan.tiers.get(i, "best"), now
    assert served == {i: "best" for i in range(8)} and max(started.values()) == 9.0
