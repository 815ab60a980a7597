"""Every future completes on every path: result, error, timeout, cancellation, shutdown.

The engine runs its real thread and scheduler over ``FakeRunner`` (no torch). Tests hold
the engine with a gate instead of sleeping, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator

import pytest

from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine
from chunlian.engine.rates import RateWindow
from chunlian.errors import Cancelled, DeadlineExceeded, EngineStopped, ModelError, Overloaded
from chunlian.types import CoupletRequest, DecodeParams
from tests.unit.fakes import FakeRunner


class BadHengpi:
    def choose(self, upper: str, lower: str, style: str, seed: int | None = None) -> str:
        if upper.startswith("坏"):
            raise RuntimeError("hengpi failed")
        return "万事如意"


def make(**kw: object) -> tuple[Engine, FakeRunner]:
    config = EngineConfig(**{"max_batch_size": 4, "max_wait_ms": 0, "max_queue_size": 8, **kw})
    runner = FakeRunner(capacity=config.max_batch_size)
    return Engine(config, runner, BadHengpi(), "fake@1"), runner


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, FakeRunner]]:
    eng, runner = make()
    await eng.start()
    yield eng, runner
    if runner.gate is not None:
        runner.gate.set()
    await eng.stop()


async def until(cond: object, steps: int = 2000) -> None:
    for _ in range(steps):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_result_path(engine: tuple[Engine, FakeRunner]) -> None:
    eng, _ = engine
    res = await eng.generate(CoupletRequest(upper="春回大地"))
    assert res.best.lower == "乙乙乙乙" and res.best.hengpi == "万事如意" and res.model == "fake@1"
    assert eng.stats.completed == 1


async def test_a_typed_dash_reaches_the_runner_as_one_mark_and_comes_back(
    engine: tuple[Engine, FakeRunner],
) -> None:
    eng, _ = engine
    # the fake writes a 下联 as long as the 上联 it was given: five characters, "春回，大地"
    res = await eng.generate(CoupletRequest(upper="春回——大地"))
    assert (res.best.upper, res.best.lower) == ("春回——大地", "乙乙——乙乙")


async def test_a_closed_line_reaches_the_runner_bare_and_is_not_coalesced_with_the_bare_one(
    engine: tuple[Engine, FakeRunner],
) -> None:
    eng, runner = engine
    runner.gate = threading.Event()
    tasks = [asyncio.create_task(eng.generate(CoupletRequest(upper=u))) for u in ("春回大地！", "春回大地")]
    await until(lambda: eng.scheduler.queue_depth + eng.scheduler.live_seqs == 2)
    runner.gate.set()
    closed, bare = await asyncio.gather(*tasks)
    assert eng.stats.coalesced == 0 and len(runner.prefilled) == 2
    assert (closed.best.upper, closed.best.lower) == ("春回大地！", "乙乙乙乙！")
    assert (bare.best.upper, bare.best.lower) == ("春回大地", "乙乙乙乙")


async def test_the_runner_is_bound_to_the_engine_thread(engine: tuple[Engine, FakeRunner]) -> None:
    eng, runner = engine
    await eng.generate(CoupletRequest(upper="春回大地"))
    assert runner.bound_thread == "chunlian-engine"
    # the engine thread runs nicer than the event loop's (config.engine_nice, default 5)
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert runner.bound_nice == min(19, here + eng.config.engine_nice)
    assert eng.config.engine_nice == 5
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # this thread untouched


async def test_n_best_returns_all_candidates_best_first(engine: tuple[Engine, FakeRunner]) -> None:
    eng, _ = engine
    res = await eng.generate(CoupletRequest(upper="春回大地", params=DecodeParams(n=3, seed=5)))
    assert len(res.candidates) == 3
    scores = [c.score for c in res.candidates]
    assert scores == sorted(scores, reverse=True) and res.best == res.candidates[0]


async def test_error_in_one_request_fails_only_that_one(engine: tuple[Engine, FakeRunner]) -> None:
    eng, _ = engine
    good, bad = await asyncio.gather(
        eng.generate(CoupletRequest(upper="春回大地")),
        eng.generate(CoupletRequest(upper="坏人坏事")),
        return_exceptions=True,
    )
    assert not isinstance(good, BaseException) and good.best.upper == "春回大地"
    assert isinstance(bad, ModelError)


async def test_failed_step_fails_its_requests_and_engine_keeps_serving(
    engine: tuple[Engine, FakeRunner],
) -> None:
    eng, runner = engine
    runner.fail_on = "炸弹爆炸"
    with pytest.raises(ModelError):
        await eng.generate(CoupletRequest(upper="炸弹爆炸"))
    runner.fail_on = None
    assert (await eng.generate(CoupletRequest(upper="平安喜乐"))).best.upper == "平安喜乐"
    assert runner.live == {}


async def test_deadline_in_queue_never_reaches_model(engine: tuple[Engine, FakeRunner]) -> None:
    eng, runner = engine
    with pytest.raises(DeadlineExceeded):
        await eng.generate(CoupletRequest(upper="春回大地", timeout_s=0.0))
    assert runner.prefilled == []
    assert eng.stats.deadline_drops == 1


async def test_cancelled_caller_frees_its_slot(engine: tuple[Engine, FakeRunner]) -> None:
    eng, runner = engine
    runner.gate = threading.Event()
    task = asyncio.create_task(eng.generate(CoupletRequest(upper="一二三四五六七八九十")))
    await until(lambda: runner.prefilled)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    runner.gate.set()
    await until(lambda: eng.stats.cancelled == 1)
    assert runner.released and runner.live == {}


async def test_coalescing_identical_requests(engine: tuple[Engine, FakeRunner]) -> None:
    eng, runner = engine
    runner.gate = threading.Event()
    r = CoupletRequest(upper="春回大地")
    tasks = [asyncio.create_task(eng.generate(r)) for _ in range(3)]
    await until(lambda: eng.stats.coalesced == 2)
    runner.gate.set()
    results = await asyncio.gather(*tasks)
    assert len({id(x) for x in results}) == 1  # one generation shared by all three
    assert len(runner.prefilled) == 1


async def test_an_interactive_caller_never_joins_a_bulk_request_or_a_shorter_deadline(
    engine: tuple[Engine, FakeRunner],
) -> None:
    eng, runner = engine
    runner.gate = threading.Event()
    bulk = CoupletRequest(upper="春回大地", priority="bulk", timeout_s=30.0)
    inter = CoupletRequest(upper="春回大地", timeout_s=30.0)
    tasks = [asyncio.create_task(eng.generate(bulk))]
    await until(lambda: runner.prefilled)
    tasks.append(asyncio.create_task(eng.generate(inter)))
    tasks.append(asyncio.create_task(eng.generate(CoupletRequest(upper="春回大地", timeout_s=60.0))))
    await until(lambda: eng.queue_depth == 2)  # two more sent; the engine is held mid-step
    tasks.append(asyncio.create_task(eng.generate(bulk)))  # may join: never lower
    await until(lambda: eng.stats.coalesced == 1)
    runner.gate.set()
    await asyncio.gather(*tasks)
    assert len(runner.prefilled) == 3 and eng.stats.completed == 3


async def test_without_coalescing_identical_requests_each_generate() -> None:
    eng, runner = make(coalesce=False)
    await eng.start()
    try:
        runner.gate = threading.Event()
        r = CoupletRequest(upper="春回大地")
        tasks = [asyncio.create_task(eng.generate(r)) for _ in range(3)]
        await until(lambda: eng.scheduler.queue_depth + eng.scheduler.live_seqs == 3)
        runner.gate.set()
        results = await asyncio.gather(*tasks)
        assert len({id(x) for x in results}) == 3 and eng.stats.coalesced == 0
        assert len(runner.prefilled) == 3 and eng.stats.completed == 3
    finally:
        runner.gate.set()
        await eng.stop()


async def test_one_cancelled_waiter_does_not_cancel_a_coalesced_request(
    engine: tuple[Engine, FakeRunner],
) -> None:
    eng, runner = engine
    runner.gate = threading.Event()
    r = CoupletRequest(upper="春回大地")
    a = asyncio.create_task(eng.generate(r))
    b = asyncio.create_task(eng.generate(r))
    await until(lambda: eng.stats.coalesced == 1)
    a.cancel()
    runner.gate.set()
    assert (await b).best.upper == "春回大地"


async def test_overload_carries_retry_after() -> None:
    eng, runner = make(max_batch_size=1, max_queue_size=1)
    runner.gate = threading.Event()
    await eng.start()
    try:
        first = asyncio.create_task(eng.generate(CoupletRequest(upper="春回大地")))
        await until(lambda: runner.prefilled)
        second = asyncio.create_task(eng.generate(CoupletRequest(upper="平安喜乐")))
        await until(lambda: eng.queue_depth == 1)
        with pytest.raises(Overloaded) as exc:
            await eng.generate(CoupletRequest(upper="万事如意"))
        assert exc.value.retry_after_s >= 1.0
        # clients pushing past a full queue stretch the advice: each rejected client returns
        for t in range(50):
            eng.core._done.add(1000.0 + t * 0.2)  # a drain of 5 per second
        eng._rejected = RateWindow(10)
        quiet = eng.retry_after_s(now_s=1009.9)
        for t in range(500):
            eng._rejected.add(1000.0 + t * 0.02)  # 50 rejections per second
        stormy = eng.retry_after_s(now_s=1009.9)
        rate = 50 / 9.9
        assert quiet == pytest.approx(max(1.0, 1 / rate))  # one request waiting
        assert stormy == pytest.approx(max(1.0, 1 / rate * (1 + 50 / rate)))  # ~11x the pressure
        runner.gate.set()
        await asyncio.gather(first, second)
    finally:
        runner.gate.set()
        await eng.stop()


async def test_shutdown_fails_every_pending_future() -> None:
    eng, runner = make()
    runner.gate = threading.Event()
    await eng.start()
    tasks = [asyncio.create_task(eng.generate(CoupletRequest(upper=u))) for u in ("春回大地", "平安喜乐")]
    await until(lambda: runner.prefilled)
    stop = asyncio.create_task(eng.stop())
    await asyncio.sleep(0.05)
    runner.gate.set()
    await stop
    results = await asyncio.gather(*tasks, return_exceptions=True)
    from chunlian.types import CoupletResult

    # each caller got an answer or EngineStopped; nobody is left waiting
    assert all(isinstance(r, (EngineStopped, CoupletResult)) for r in results), results
    assert all(t.done() for t in tasks)
    with pytest.raises(EngineStopped):
        await eng.generate(CoupletRequest(upper="春回大地"))


class Fatal(BaseException):
    """Not an ``Exception``: what the core lets through (an interpreter shutdown, say)."""


async def test_engine_failure_completes_every_future() -> None:
    eng, runner = make()
    runner.gate = threading.Event()
    await eng.start()
    task = asyncio.create_task(eng.generate(CoupletRequest(upper="春回大地")))
    await until(lambda: runner.prefilled)

    def broken_plan(now_s: float) -> object:
        raise Fatal("the interpreter is going")

    eng.scheduler.plan = broken_plan  # type: ignore[method-assign]
    runner.gate.set()
    with pytest.raises(EngineStopped):
        await task
    await eng.stop()


async def test_cancelled_error_is_a_cancel_not_a_failure(engine: tuple[Engine, FakeRunner]) -> None:
    eng, _ = engine
    eng.scheduler.cancel(12345)  # unknown ids are ignored
    assert isinstance(Cancelled("x"), Exception)
    assert (await eng.generate(CoupletRequest(upper="春回大地"))).best.upper == "春回大地"


def test_static_batching_asks_the_runner_for_padded_batches() -> None:
    """``batching = "static"`` is request-level batching: the runner keeps each admitted
    batch as one padded rectangle; continuous batching retires rows at once."""
    assert make(batching="static")[1].padded_batches is True
    assert make(batching="continuous")[1].padded_batches is False


async def test_requests_join_a_running_batch_in_one_fused_step() -> None:
    """Continuous batching: a request that arrives while others decode is admitted through
    ``runner.step`` (its prefill fused with their decode step), and both answers come."""
    eng, runner = make()
    runner.gate = threading.Event()
    await eng.start()
    try:
        first = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地暖")))
        await until(lambda: runner.prefilled)  # the first request is in its (gated) prefill
        second = asyncio.ensure_future(eng.generate(CoupletRequest(upper="福满人间")))
        await asyncio.sleep(0.05)
        runner.gate.set()
        got = await asyncio.gather(first, second)
        assert [r.best.lower for r in got] == ["乙" * 5, "乙" * 4]
        assert runner.steps_fused >= 1
    finally:
        runner.gate.set()
        await eng.stop()
