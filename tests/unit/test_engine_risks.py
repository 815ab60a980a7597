"""The smaller risks of the engine core: a late answer after a 504 is cached, searched
answers are keyed by the search weights, stopping never touches the core from the event
loop, a wedged replica is replaced, and a best request that can never meet its deadline is
told why."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from chunlian.api.service import CoupletService
from chunlian.cache import MemoryStore, ResultCache
from chunlian.engine import engine as engine_mod
from chunlian.engine.config import EngineConfig
from chunlian.engine.scheduler import Hopeless, SchedRequest, Scheduler, SchedulerConfig
from chunlian.errors import DeadlineExceeded, EngineStopped
from chunlian.types import CoupletRequest
from tests.unit.api_fakes import FakeEngine
from tests.unit.fakes import FakeRunner, small_fake_engine


async def test_an_answer_finished_just_after_its_504_is_cached_for_the_retry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chunlian.engine import scheduler

    monkeypatch.setattr(scheduler, "RUNNING_GRACE_S", 5.0)  # a loaded test machine is slow
    eng, runner = small_fake_engine()
    runner.gate = threading.Event()
    await eng.start()
    try:
        svc = CoupletService(eng, ResultCache([MemoryStore(16)], ttl_s=60))
        req = CoupletRequest(upper="春回大地", timeout_s=0.2)
        with pytest.raises(DeadlineExceeded):
            await svc.generate(req, arrival_s=time.perf_counter())
        runner.gate.set()  # decoding goes on past the deadline, within the grace, and finishes
        for _ in range(500):
            if await svc.cached(req) is not None:
                break
            await asyncio.sleep(0.01)
        assert await svc.cached(req) is not None
    finally:
        runner.gate.set()
        await eng.stop()


async def test_searched_answers_are_keyed_by_the_search_weights_too() -> None:
    engine = FakeEngine()
    engine.started = True
    shared = ResultCache([MemoryStore(16)], ttl_s=60)  # a Redis shared by two configurations
    best = CoupletRequest(upper="春回大地", quality="best")
    fast = CoupletRequest(upper="春回大地", quality="fast")
    svc = CoupletService(engine, shared)
    engine.search_tag = "chunlian-couplet@rev-1"
    await svc.generate(best)
    await svc.generate(fast)
    assert await svc.cached(best) is not None
    engine.search_tag = "chunlian-couplet@rev-2"  # new search weights, the same main weights
    assert await svc.cached(best) is None
    assert await svc.cached(fast) is not None


async def test_stop_never_touches_the_core_from_the_event_loop_while_a_step_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "JOIN_LIMIT_S", 0.1)
    eng, runner = small_fake_engine()
    runner.gate = threading.Event()
    callers: list[str] = []
    fail_all = eng.core.fail_all

    def recording_fail_all(error):  # type: ignore[no-untyped-def]
        callers.append(threading.current_thread().name)
        return fail_all(error)

    eng.core.fail_all = recording_fail_all  # type: ignore[method-assign]
    await eng.start()
    task = asyncio.create_task(eng.generate(CoupletRequest(upper="春回大地")))
    for _ in range(200):
        if runner.prefilled:
            break
        await asyncio.sleep(0.005)
    await eng.stop()  # the step is still held: the engine thread has not ended
    with pytest.raises(EngineStopped):
        await task
    assert callers == []
    runner.gate.set()
    for _ in range(200):
        if callers:
            break
        await asyncio.sleep(0.005)
    assert callers == ["chunlian-engine"]


def test_a_best_request_whose_timeout_is_below_the_measured_best_time_is_told_why() -> None:
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_wait_ms=0.0, beam_rows=64))
    s.service_s["best"] = 3.0
    with pytest.raises(Hopeless, match=r"takes about 3\.0 s.*2\.0 s"):
        s.add(SchedRequest(1, "interactive", 1, 0.0, 2.0, tier="best"))
    s.add(SchedRequest(2, "interactive", 1, 0.0, 4.0, tier="best"))


def test_the_core_answers_a_hopeless_best_request_with_a_clear_error_on_its_timeout() -> None:
    from chunlian.engine.core import CoreRequest, EngineCore
    from chunlian.errors import InvalidInput

    core = EngineCore(EngineConfig(max_batch_size=4, beam_rows=32), FakeRunner(4),
                      search_runner=FakeRunner(32), rescorer=object())  # type: ignore[arg-type]
    core.scheduler.service_s["best"] = 3.0
    with pytest.raises(InvalidInput, match="takes about 3.0 s") as e:
        core.add_request(CoreRequest(1, CoupletRequest(upper="春回大地", quality="best"), time.monotonic() + 2.0))
    assert e.value.field == "timeout_ms" and not core.has_unfinished
