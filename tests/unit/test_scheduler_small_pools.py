"""Small pools (an 8-row replica: ``MAX_BATCH_SIZE=64`` on 8 cores): the head of the
interactive queue is admitted within a bounded number of steps whatever bulk work arrives,
and an engine with nothing it can run never spins."""

from __future__ import annotations

import math
import random

import pytest

from chunlian.engine.scheduler import SchedRequest, Scheduler, SchedulerConfig

STEP_S = 0.01
RUN_STEPS = 6  # every admitted request runs this many steps


def sched(rows: int) -> Scheduler:
    return Scheduler(SchedulerConfig(max_batch_size=rows, max_wait_ms=0.0, max_queue_size=10_000,
                                     batching="continuous", bulk_min_share=0.125))


def simulate(s: Scheduler, arrivals: dict[int, list[tuple[str, int]]], steps: int) -> dict[int, int]:
    """Run ``steps`` plans; ``arrivals``: step -> (priority, n) added before it. Returns, for
    each interactive request, the steps it waited at the head of its queue."""
    ids = iter(range(1, 1_000_000))
    left: dict[int, int] = {}
    rows_of: dict[int, int] = {}
    prio: dict[int, str] = {}
    head_since: dict[int, int] = {}
    waited: dict[int, int] = {}
    for k in range(steps):
        now = k * STEP_S
        for p, n in arrivals.get(k, []):
            i = next(ids)
            s.add(SchedRequest(i, p, n, now, math.inf))  # type: ignore[arg-type]
            rows_of[i], prio[i] = n, p
        q = s.waiting["interactive"]
        if q and q[0].req_id not in head_since:
            head_since[q[0].req_id] = k
        plan = s.plan(now)
        assert plan.has_work or not s.queue_depth, f"step {k}: requests wait, nothing runs"
        for i in plan.prefill:
            left[i] = RUN_STEPS
            if prio[i] == "interactive":
                waited[i] = k - head_since.get(i, k)
        for i in list(left):
            left[i] -= 1
            if left[i] == 0:
                del left[i]
                s.on_seqs_finished(i, rows_of[i], now)
    heads = [i for i, p in prio.items() if p == "interactive"]
    missing = [i for i in heads if i not in waited]
    assert not missing, f"interactive requests never admitted: {missing}"
    return waited


@pytest.mark.parametrize("rows", [8, 16])
def test_an_interactive_request_as_wide_as_the_pool_is_admitted_beside_a_bulk_stream(rows: int) -> None:
    """A steady stream of bulk n=1 (and some n=2) with interactive n=rows and n=rows/2 among it."""
    rng = random.Random(rows)
    arrivals: dict[int, list[tuple[str, int]]] = {}
    for k in range(400):
        arrivals.setdefault(k, []).append(("bulk", 1 if rng.random() < 0.8 else 2))
        if k % 25 == 3:
            arrivals[k].append(("interactive", rows))
        if k % 25 == 15:
            arrivals[k].append(("interactive", rows // 2))
    waited = simulate(sched(rows), arrivals, 600)
    # the head waits at most for the rows running when it became head to finish
    assert max(waited.values()) <= RUN_STEPS + 1, waited


@pytest.mark.parametrize("rows", [8, 16])
def test_an_interactive_compose_of_n_rows_beside_a_bulk_n2_is_admitted(rows: int) -> None:
    arrivals = {0: [("bulk", 2)], 1: [("interactive", rows), ("bulk", 2)], 2: [("bulk", 2), ("bulk", 1)]}
    waited = simulate(sched(rows), arrivals, 60)
    assert max(waited.values()) <= RUN_STEPS + 1, waited


def test_interactive_heads_under_random_load_wait_a_bounded_number_of_steps() -> None:
    for rows in (8, 16):
        rng = random.Random(7 + rows)
        arrivals: dict[int, list[tuple[str, int]]] = {}
        for k in range(300):
            for _ in range(rng.randrange(3)):
                p = "interactive" if rng.random() < 0.5 else "bulk"
                arrivals.setdefault(k, []).append((p, rng.choice([1, 1, 2, rows // 2, rows])))
        waited = simulate(sched(rows), arrivals, 3000)
        # FIFO among interactive requests: the head waits for rows, never for bulk
        assert max(waited.values()) <= RUN_STEPS + 1, (rows, max(waited.values()))


def test_with_nothing_it_can_admit_the_engine_sleeps_until_a_deadline_instead_of_spinning() -> None:
    s = sched(8)
    s.add(SchedRequest(1, "interactive", 2, 0.0, 5.0))
    s.add(SchedRequest(2, "bulk", 1, 0.0, 3.0))
    s._admit = lambda plan, now_s: None  # type: ignore[method-assign]  # whatever keeps them out
    plan = s.plan(1.0)
    assert not plan.has_work and plan.idle_wait_s == pytest.approx(2.0)  # the first deadline
