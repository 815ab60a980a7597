"""The replica dispatcher (``engine.replicas``) over fake engines: routing, coalescing,
summed stats, start and stop on every path, and the settings each replica gets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from chunlian import errors as E
from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import EngineStats, StepReport
from chunlian.engine.replicas import ReplicatedEngine, replica_config, share
from chunlian.errors import ConfigError
from chunlian.types import Couplet, CoupletRequest, CoupletResult, DecodeParams


class FakeReplica:
    """Answers when told to (``release``), records what it was sent."""

    def __init__(self, name: str, fail_start: bool = False) -> None:
        self.name = name
        self.model_tag = f"fake@{name}"
        self.search_tag = f"fake@rev-{name}"
        self.stats = EngineStats()
        self.sent: list[CoupletRequest] = []
        self.gates: list[asyncio.Event] = []
        self.alive = False
        self.fail_start = fail_start
        self.stopped = False
        self.listeners: list[Callable[[StepReport], None]] = []

    @property
    def running(self) -> bool:
        return self.alive

    async def start(self) -> None:
        await asyncio.sleep(0)
        if self.fail_start:
            raise E.ModelError(f"{self.name} cannot load")
        self.alive = True

    async def stop(self) -> None:
        self.alive, self.stopped = False, True
        for g in self.gates:
            g.set()

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        self.sent.append(req)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if not self.alive:
            raise E.EngineStopped("stopped")
        return CoupletResult(best=Couplet(upper=req.upper or "", lower="", hengpi="", style=req.style),
                             model=self.name)

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self.listeners.append(fn)

    def release_all(self) -> None:
        for g in self.gates:
            g.set()


def _engine(n: int, **over: object) -> tuple[ReplicatedEngine, list[FakeReplica]]:
    fakes = [FakeReplica(f"r{i}") for i in range(n)]
    config = EngineConfig(max_batch_size=8, **over)
    return ReplicatedEngine(config, fakes), fakes


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_requests_go_to_the_least_loaded_replica() -> None:
    eng, fakes = _engine(2)
    await eng.start()
    tasks = [asyncio.ensure_future(eng.generate(CoupletRequest(upper=f"春回大地{i}"))) for i in range(6)]
    await _settle()
    assert [len(f.sent) for f in fakes] == [3, 3]
    fakes[0].release_all()  # replica 0 answers its three; the next three all go to it
    await asyncio.gather(*tasks[:6:2])
    more = [asyncio.ensure_future(eng.generate(CoupletRequest(upper=f"福满人间{i}"))) for i in range(3)]
    await _settle()
    assert [len(f.sent) for f in fakes] == [6, 3]
    for f in fakes:
        f.release_all()
    await asyncio.gather(*tasks, *more)
    assert eng._outstanding == [0, 0]


async def test_a_request_needing_n_rows_counts_n() -> None:
    eng, fakes = _engine(2)
    await eng.start()
    big = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地", params=DecodeParams(n=4, seed=1))))
    await _settle()
    small = [asyncio.ensure_future(eng.generate(CoupletRequest(upper=f"万事如意{i}"))) for i in range(3)]
    await _settle()
    assert [len(f.sent) for f in fakes] == [1, 3]  # 4 rows on r0 against 1, 2, 3 on r1
    for f in fakes:
        f.release_all()
    await asyncio.gather(big, *small)


async def test_identical_requests_in_flight_share_one_generation_and_coalescing_can_be_off() -> None:
    for coalesce, expect in ((True, [1, 0]), (False, [2, 1])):
        eng, fakes = _engine(2, coalesce=coalesce)
        await eng.start()
        same = CoupletRequest(upper="春回大地千山秀")
        tasks = [asyncio.ensure_future(eng.generate(same)) for _ in range(3)]
        await _settle()
        assert [len(f.sent) for f in fakes] == expect
        for f in fakes:
            f.release_all()
        got = await asyncio.gather(*tasks)
        assert len({id(r) for r in got}) == (1 if coalesce else 3)
        assert eng.stats.coalesced == (2 if coalesce else 0)
        assert eng._inflight._by_key == {}


async def test_a_merge_never_gives_a_caller_lower_priority_or_a_shorter_deadline() -> None:
    """An interactive caller never joins a bulk request in flight (its answer could be
    narrowed under the bulk share) nor one with a shorter deadline; a bulk caller may join an
    interactive one, and a caller with a shorter deadline may join a longer one."""
    eng, fakes = _engine(1)
    await eng.start()
    line = "春回大地千山秀"
    bulk = CoupletRequest(upper=line, quality="best", priority="bulk", timeout_s=30.0)
    inter = CoupletRequest(upper=line, quality="best", timeout_s=30.0)
    tasks = [asyncio.ensure_future(eng.generate(bulk))]
    await _settle()
    tasks.append(asyncio.ensure_future(eng.generate(inter)))  # must not join the bulk one
    await _settle()
    assert [r.priority for r in fakes[0].sent] == ["bulk", "interactive"]
    tasks.append(asyncio.ensure_future(eng.generate(bulk)))  # joins the interactive one
    tasks.append(asyncio.ensure_future(eng.generate(replace(inter, timeout_s=5.0))))  # joins too
    await _settle()
    assert len(fakes[0].sent) == 2 and eng.stats.coalesced == 2
    tasks.append(asyncio.ensure_future(eng.generate(replace(inter, timeout_s=60.0))))  # a longer deadline
    await _settle()
    assert [r.timeout_s for r in fakes[0].sent] == [30.0, 30.0, 60.0]
    fakes[0].release_all()
    await asyncio.gather(*tasks)
    assert eng._inflight._by_key == {}


async def test_a_request_whose_replica_dies_goes_to_another_and_errors_free_the_slot() -> None:
    eng, fakes = _engine(2)
    await eng.start()
    task = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地")))
    await _settle()
    assert [len(f.sent) for f in fakes] == [1, 0]
    await fakes[0].stop()  # replica 0 dies under its request: it is sent to replica 1
    await _settle()
    assert [len(f.sent) for f in fakes] == [1, 1] and not task.done()
    fakes[1].release_all()
    assert (await task).best.upper == "春回大地"
    assert eng._outstanding == [0, 0] and eng._inflight._by_key == {}
    assert eng.running and eng.replicas_up == 1  # degraded: the other one serves
    # what is still sent goes to the running replica
    before = len(fakes[1].sent)
    t2 = asyncio.ensure_future(eng.generate(CoupletRequest(upper="福满人间")))
    await _settle()
    assert len(fakes[1].sent) == before + 1 and len(fakes[0].sent) == 1
    fakes[1].release_all()
    await t2
    await fakes[1].stop()
    with pytest.raises(E.EngineStopped):
        await eng.generate(CoupletRequest(upper="国泰民安"))


async def test_a_request_is_sent_once_more_only() -> None:
    eng, fakes = _engine(3)
    await eng.start()
    task = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地")))
    await _settle()
    first = next(f for f in fakes if f.sent)
    await first.stop()
    await _settle()
    second = next(f for f in fakes if f.sent and f is not first)
    await second.stop()  # the second replica dies too: the caller gets the error
    with pytest.raises(E.EngineStopped):
        await task
    assert eng.replicas_up == 1 and sum(len(f.sent) for f in fakes) == 2


async def test_cancelled_callers_free_their_rows() -> None:
    eng, fakes = _engine(2)
    await eng.start()
    task = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地")))
    await _settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert eng._outstanding == [0, 0] and eng._inflight._by_key == {}


async def test_a_failed_start_stops_every_replica() -> None:
    fakes = [FakeReplica("a"), FakeReplica("b", fail_start=True)]
    eng = ReplicatedEngine(EngineConfig(max_batch_size=8), fakes)
    with pytest.raises(E.ModelError, match="b cannot load"):
        await eng.start()
    assert all(f.stopped and not f.running for f in fakes)


async def test_stats_are_summed_and_listeners_reach_every_replica() -> None:
    eng, fakes = _engine(3)
    await eng.start()
    for i, f in enumerate(fakes):
        f.stats = EngineStats(queue_depth=i, running=2 * i, max_queue_size=10, completed=100 + i)
    total = eng.stats
    assert (total.queue_depth, total.running, total.max_queue_size, total.completed) == (3, 6, 30, 303)
    seen: list[StepReport] = []
    eng.add_step_listener(seen.append)
    for f in fakes:
        f.listeners[0](StepReport(4, 0.01, 4))
    assert len(seen) == 3
    assert eng.model_tag == "fake@r0"
    with pytest.raises(ValueError):
        ReplicatedEngine(EngineConfig(), [])


def test_replicas_share_the_batch_the_queue_and_the_cores() -> None:
    assert [share(5, 2, i) for i in range(2)] == [3, 2]
    assert sum(share(128, 3, i) for i in range(3)) == 128
    s = load_settings(warmup="", max_batch_size=5, max_queue_size=9, engine_replicas=2, torch_threads=0)
    parts = [replica_config(EngineConfig.from_settings(s), i) for i in range(2)]
    assert [p.max_batch_size for p in parts] == [3, 2] and [p.max_queue_size for p in parts] == [5, 4]
    assert all(p.replicas == 1 and p.torch_threads >= 1 for p in parts)
    three = EngineConfig.from_settings(load_settings(warmup="", torch_threads=3, engine_replicas=2))
    assert replica_config(three, 0).torch_threads == 3


def test_replica_count_is_validated_and_resolved() -> None:
    with pytest.raises(ConfigError, match="ENGINE_REPLICAS must be at most"):
        load_settings(engine_replicas=4, max_batch_size=2)
    assert load_settings(engine_replicas=3, max_batch_size=8).resolved_engine_replicas() == 3
    assert load_settings(engine_replicas=0, max_batch_size=1, device="cpu").resolved_engine_replicas() == 1
    assert load_settings(engine_replicas=0, device="cuda").resolved_engine_replicas() == 1
    auto = load_settings(engine_replicas=0, device="cpu").resolved_engine_replicas()
    assert 1 <= auto <= 8


def test_auto_replicas_fit_explicit_torch_threads_into_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from chunlian.config import subconfigs as config

    monkeypatch.setattr(config, "usable_cores", lambda: 2)
    auto = {t: load_settings(engine_replicas=0, torch_threads=t, device="cpu") for t in (0, 1, 2, 3)}
    # 0 and 1: one single-threaded replica a core; 2 (and more) on 2 cores: one engine with them
    assert {t: s.resolved_engine_replicas() for t, s in auto.items()} == {0: 2, 1: 2, 2: 1, 3: 1}
    assert [auto[t].resolved_replica_threads(auto[t].resolved_engine_replicas()) for t in (0, 2)] == [1, 2]
    monkeypatch.setattr(config, "usable_cores", lambda: 8)
    assert load_settings(engine_replicas=0, torch_threads=2, device="cpu").resolved_engine_replicas() == 4
    assert load_settings(engine_replicas=3, torch_threads=2, device="cpu").resolved_engine_replicas() == 3
    with pytest.raises(ConfigError):
        load_settings(engine_replicas=-1)


async def test_a_stopped_replica_is_replaced_and_its_counters_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from chunlian.engine import replicas as R

    monkeypatch.setattr(R, "SUPERVISE_EVERY_S", 0.01)
    monkeypatch.setattr(R, "RESTART_BACKOFF_S", (0.01,))
    made: list[FakeReplica] = []
    failing = [2]  # the first two replacements fail to start

    def factory(i: int) -> FakeReplica:
        fail = len(made) >= 2 and failing[0] > 0
        if fail:
            failing[0] -= 1
        f = FakeReplica(f"r{i}-{len(made)}", fail_start=fail)
        made.append(f)
        return f

    eng = ReplicatedEngine(EngineConfig(max_batch_size=8), [factory(0), factory(1)], factory)
    seen: list[StepReport] = []
    eng.add_step_listener(seen.append)
    await eng.start()
    supervisor = eng._supervisor
    await eng.start()  # the runtime starts a child-process engine twice: the second is a no-op
    assert eng._supervisor is supervisor and len(made) == 2
    try:
        eng.replicas[0].stats = EngineStats(completed=7, running=3, queue_depth=2)
        await eng.replicas[0].stop()  # dies
        assert eng.running and eng.replicas_up == 1
        assert eng.stats.running == 0  # a dead replica's gauges no longer count
        for _ in range(200):
            if eng.replicas_up == 2:
                break
            await asyncio.sleep(0.01)
        assert eng.replicas_up == 2 and eng.restarts == 1
        new = eng.replicas[0]
        assert isinstance(new, FakeReplica) and new.name == "r0-4" and not failing[0]
        assert [f.stopped for f in made[2:4]] == [True, True]  # the failed starts were cleaned up
        assert eng.stats.completed == 7  # the old replica's counter is kept
        new.listeners[0](StepReport(1, 0.01, 1))  # listeners carried over
        assert len(seen) == 1
        t = asyncio.ensure_future(eng.generate(CoupletRequest(upper="春回大地")))
        await _settle()
        assert len(new.sent) == 1 or len(eng.replicas[1].sent) == 1  # type: ignore[attr-defined]
        for r in eng.replicas:
            r.release_all()  # type: ignore[attr-defined]
        await t
    finally:
        await eng.stop()
    assert not eng.running and all(f.stopped for f in eng.replicas)  # type: ignore[attr-defined]


def test_the_offline_replicas_peak_sums_children_that_split_the_rows_and_the_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import subprocess

    from chunlian.bench import engine as bench_engine

    codes: list[str] = []

    class FakeChild:
        returncode = 0

        def __init__(self, argv: list[str], **_: object) -> None:
            codes.append(argv[-1])
            self.rate = 100.0 + 10 * len(codes)

        def communicate(self, timeout: float | None = None) -> tuple[str, str]:
            out = {"seq_per_s": self.rate, "steady_seq_per_s": self.rate + 5, "requests": 50}
            return "log line\n" + json.dumps(out) + "\n", ""

    monkeypatch.setattr(subprocess, "Popen", FakeChild)
    r = bench_engine.replicated_peak(None, 5, 100, 2, 1, "http", seeded_share=1.0)
    assert r["seq_per_s"] == 110.0 + 120.0 and r["steady_seq_per_s"] == 115.0 + 125.0
    assert r["by_replica_steady_seq_per_s"] == [115.0, 125.0] and r["requests"] == 100
    # rows 3 + 2; every child gets the whole list and takes its stride of it
    assert "peak(None, 3, 100, 1, 'http'" in codes[0] and "part=(0, 2)" in codes[0]
    assert "peak(None, 2, 100, 1, 'http'" in codes[1] and "part=(1, 2)" in codes[1]
