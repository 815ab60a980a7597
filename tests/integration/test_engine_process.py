"""The engine core in its own process (``engine.process``): a real child with the shipped
model. Every future completes on every path: result, error, overload, cancellation, stop,
and the child dying under load."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from chunlian import errors as E
from chunlian.config import load_settings
from chunlian.data.samples import sample_uppers
from chunlian.engine.config import EngineConfig
from chunlian.engine.messages import decode_error, encode_error
from chunlian.engine.process import ProcessEngine
from chunlian.types import CoupletRequest


def test_errors_cross_the_pipe_with_their_fields() -> None:
    over = decode_error(encode_error(E.Overloaded("queue full", 3.5)))
    assert isinstance(over, E.Overloaded) and over.retry_after_s == 3.5 and str(over) == "queue full"
    bad = decode_error(encode_error(E.InvalidInput("no", "upper")))
    assert isinstance(bad, E.InvalidInput) and bad.field == "upper"
    assert isinstance(decode_error(encode_error(E.DeadlineExceeded("late"))), E.DeadlineExceeded)
    other = decode_error(encode_error(KeyError("x")))  # not ours: a model error, no internals
    assert isinstance(other, E.ModelError) and "KeyError" in str(other)
    assert isinstance(decode_error(("NoSuchError", "m", {})), E.ModelError)


async def test_a_child_process_serves_and_every_path_completes() -> None:
    engine = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=8, max_queue_size=4, warmup="")))
    await engine.start()
    try:
        assert engine.running and engine.model_tag.startswith("chunlian-couplet@")
        res = await engine.generate(CoupletRequest(upper="春回大地千山秀"))
        assert len(res.best.lower) == 7 and len(res.best.hengpi) == 4
        # overload: the queue holds 4, the rest are refused with a retry-after
        outs = await asyncio.gather(*(engine.generate(CoupletRequest(upper="春" * k + "回"))
                                      for k in range(1, 19)), return_exceptions=True)
        over = [o for o in outs if isinstance(o, E.Overloaded)]
        assert over and all(o.retry_after_s >= 1 for o in over)
        assert all(not isinstance(o, Exception) or isinstance(o, E.Overloaded) for o in outs)
        # cancellation: the caller goes away; the child counts it and frees the slot
        task = asyncio.ensure_future(engine.generate(CoupletRequest(upper="国泰民安家家乐")))
        await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(40):  # stats arrive every 0.25 s
            if engine.stats.completed >= 5:
                break
            await asyncio.sleep(0.1)
        assert engine.stats.completed >= 5 and engine.stats.rejected == len(over)
    finally:
        await engine.stop()
    assert not engine.running
    with pytest.raises(E.EngineStopped):
        await engine.generate(CoupletRequest(upper="春回大地"))


async def test_a_child_runs_at_the_configured_nice_once() -> None:
    """Every thread of the engine process (the core's loop on its main thread and the torch
    threads it starts) runs ``engine_nice`` above the process that started it: applied once,
    where the process starts."""
    if not hasattr(os, "getpriority"):
        pytest.skip("no per-thread priorities here")
    engine = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=4, engine_nice=3, warmup="")))
    base = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's: the one that spawns the child
    await engine.start()
    try:
        # an answer: the core's loop has started and decoded
        assert len((await engine.generate(CoupletRequest(upper="春回大地千山秀"))).best.lower) == 7
        assert engine._proc is not None and engine._proc.pid is not None
        tids = [int(t) for t in os.listdir(f"/proc/{engine._proc.pid}/task")]
        assert tids  # the core's loop runs on the main thread (engine.corerun)
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {min(19, base + 3)}
    finally:
        await engine.stop()


async def test_an_unexpected_exception_at_admission_or_in_a_step_never_ends_the_engine_process() -> None:
    from tests.integration.faulty_child import ADMIT_FAILS, STEP_FAILS, faulty_child_main

    engine = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=4, warmup="")),
                           child=faulty_child_main)
    await engine.start()
    try:
        for line, says in ((ADMIT_FAILS, "admission failed"), (STEP_FAILS, "engine step failed")):
            with pytest.raises(E.ModelError, match=says):
                await engine.generate(CoupletRequest(upper=line))
            assert engine.running
            res = await engine.generate(CoupletRequest(upper="春回大地千山秀"))
            assert len(res.best.lower) == 7
        assert engine._proc is not None and engine._proc.is_alive()
    finally:
        await engine.stop()


async def test_a_wedged_child_reports_not_running_and_stop_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from chunlian.engine import process
    from tests.integration.faulty_child import STEP_HANGS, faulty_child_main

    monkeypatch.setattr(process, "WEDGED_AFTER_S", 1.0)
    engine = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=4, warmup="")),
                           child=faulty_child_main)
    await engine.start()
    try:
        await asyncio.sleep(1.5)
        assert engine.running  # idle, its stats keep coming
        stuck = asyncio.ensure_future(engine.generate(CoupletRequest(upper=STEP_HANGS, timeout_s=60.0)))
        for _ in range(60):
            if not engine.running:
                break
            await asyncio.sleep(0.1)
        assert not engine.running and engine.wedged
    finally:
        await asyncio.wait_for(engine.stop(), 5.0)  # killed at once, not after STOP_LIMIT_S
    with pytest.raises(E.EngineStopped):
        await stuck


async def test_a_dead_child_fails_every_pending_request() -> None:
    engine = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=4, warmup="")))
    await engine.start()
    try:
        # 120 distinct lines through 4 slots: the child is still busy for a long while after
        # its first answer, which is when it is killed (no sleep to guess the right moment)
        pending = [asyncio.ensure_future(engine.generate(CoupletRequest(upper=u)))
                   for u in sample_uppers()[:120]]
        await asyncio.wait(pending, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert engine._proc is not None and engine._proc.pid is not None
        os.kill(engine._proc.pid, signal.SIGKILL)
        outs = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 30)
        assert any(isinstance(o, E.EngineStopped) for o in outs)
        assert all(isinstance(o, E.EngineStopped) or not isinstance(o, BaseException) for o in outs)
        for _ in range(50):
            if not engine.running:
                break
            await asyncio.sleep(0.1)
        assert not engine.running  # the instance then reports not ready
    finally:
        await engine.stop()


async def test_replicas_serve_in_their_own_processes_and_a_dead_one_is_replaced() -> None:
    """Two real engine processes behind the dispatcher (``engine.replicas``): answers equal
    a single engine's (greedy answers do not depend on batch companions), work reaches both,
    and killing one loses nothing: its pending requests are answered by the other, which serves
    on while the supervisor starts a new process, after which both answer again."""
    from chunlian.engine.replicas import ReplicatedEngine

    settings = load_settings(max_batch_size=8, max_queue_size=256, engine_replicas=2, warmup="")
    engine = ReplicatedEngine.from_config(EngineConfig.from_settings(settings))
    single = ProcessEngine(EngineConfig.from_settings(load_settings(max_batch_size=8, warmup="", engine_replicas=1)))
    await asyncio.gather(engine.start(), single.start())
    try:
        assert engine.running and len(engine.replicas) == 2
        assert [r.config.max_batch_size for r in engine.replicas] == [4, 4]  # type: ignore[attr-defined]
        lines = sample_uppers()[:16]
        outs = await asyncio.gather(*(engine.generate(CoupletRequest(upper=u)) for u in lines))
        ref = await asyncio.gather(*(single.generate(CoupletRequest(upper=u)) for u in lines))
        assert [o.best.lower for o in outs] == [r.best.lower for r in ref]
        for _ in range(40):  # stats arrive every 0.25 s
            if engine.stats.completed >= 16:
                break
            await asyncio.sleep(0.1)
        assert engine.stats.completed >= 16
        assert all(r.stats.completed > 0 for r in engine.replicas)  # both did work
        pending = [asyncio.ensure_future(engine.generate(CoupletRequest(upper=u)))
                   for u in sample_uppers()[16:80]]
        await asyncio.wait(pending, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        victim_engine = engine.replicas[0]
        victim = victim_engine._proc  # type: ignore[attr-defined]
        assert victim is not None and victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        outs2 = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 120)
        # the killed replica's requests were sent again, to the other: none is lost (its
        # queue, 128, holds them all; a full one would answer Overloaded, a 429)
        assert not [o for o in outs2 if isinstance(o, BaseException)]
        assert engine.running  # the other replica goes on serving ...
        for _ in range(600):  # ... while the supervisor starts a new process (model load)
            if engine.replicas_up == 2 and engine.replicas[0] is not victim_engine:
                break
            await asyncio.sleep(0.1)
        assert engine.replicas_up == 2 and engine.restarts == 1
        again = await asyncio.gather(*(engine.generate(CoupletRequest(upper=u)) for u in lines))
        assert [o.best.lower for o in again] == [r.best.lower for r in ref]
    finally:
        await asyncio.gather(engine.stop(), single.stop())
