"""The idle upgrade (``api.upgrade``): hot lines answered below the best mode are re-answered
in it while the engine idles, and the upgrade gives way to live requests at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from chunlian.api.hotlines import HotLines
from chunlian.bench.promtext import metric, parse_metrics
from chunlian.types import CoupletRequest, CoupletResult
from tests.unit.api_fakes import FakeEngine, Harness, running_app

UPGRADE = {"idle_upgrade": True, "idle_upgrade_after_ms": 20}


def _req(upper: str) -> CoupletRequest:
    return CoupletRequest(upper=upper)


def test_hot_lines_give_the_most_asked_first_and_only_lines_asked_twice() -> None:
    hot = HotLines()
    for upper, times in (("一", 1), ("二", 3), ("三", 2)):
        for _ in range(times):
            hot.asked(upper, _req(upper))
    assert hot.pending == 2
    taken = [hot.take(), hot.take(), hot.take()]
    assert [t.key if t else None for t in taken] == ["二", "三", None]
    assert len(hot) == 1  # 一, asked once, waits


def test_a_line_put_back_keeps_its_asks_and_those_that_came_meanwhile() -> None:
    hot = HotLines()
    hot.asked("a", _req("a"))
    hot.asked("a", _req("a"))
    line = hot.take()
    assert line is not None and line.asked == 2
    hot.asked("a", _req("a"))
    hot.put_back(line)
    again = hot.take()
    assert again is not None and again.asked == 3


def test_a_full_table_forgets_the_least_asked_half() -> None:
    hot = HotLines(max_lines=4)
    for _ in range(5):
        hot.asked("hot", _req("hot"))
    for k in range(10):  # a flood of lines asked once
        hot.asked(f"once{k}", _req(f"once{k}"))
    assert len(hot) <= 4
    line = hot.take()
    assert line is not None and line.key == "hot" and line.asked == 5


def test_an_upgraded_line_is_no_longer_hot() -> None:
    hot = HotLines()
    for _ in range(2):
        hot.asked("a", _req("a"))
    hot.upgraded("a")
    assert hot.pending == 0 and hot.take() is None


@pytest.mark.parametrize("bad", [{"max_lines": 0}, {"min_asked": 0}])
def test_hot_lines_refuse_bad_bounds(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        HotLines(**bad)


async def _outcomes(h: Harness) -> dict[str, float]:
    text = (await h.client.get("/metrics")).text
    return {o: metric(parse_metrics(text), "chunlian_idle_upgrades_total", outcome=o)
            for o in ("upgraded", "yielded", "skipped", "failed")}


async def _until(h: Harness, outcome: str, count: float, limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while (await _outcomes(h))[outcome] < count:
        assert time.monotonic() < deadline, f"no {outcome} upgrade within {limit_s} s: {await _outcomes(h)}"
        await asyncio.sleep(0.02)


async def test_a_line_asked_twice_below_best_is_answered_best_once_the_engine_idles() -> None:
    async with running_app(**UPGRADE) as h:
        h.engine.auto_serves = "fast"  # a peak: auto steps down
        first = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        again = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        assert first.json()["served"] == again.json()["served"] == "fast" and again.json()["cached"]
        await _until(h, "upgraded", 1)
        upgrade = h.engine.calls[-1]
        assert (upgrade.upper, upgrade.quality, upgrade.priority) == ("春回大地千山秀", "best", "bulk")
        for quality in ("auto", "fast", "best"):
            r = (await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀", "quality": quality})).json()
            assert (r["served"], r["cached"]) == ("best", True), quality
        assert len(h.engine.calls) == 2  # the first answer and the upgrade


async def test_a_line_asked_once_or_answered_best_is_never_upgraded() -> None:
    async with running_app(**UPGRADE) as h:
        h.engine.auto_serves = "fast"
        await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        for _ in range(2):
            await h.client.post("/v1/couplets", json={"upper": "福满人间万户春", "quality": "best"})
        await asyncio.sleep(0.3)  # fifteen idle periods
        assert [c.quality for c in h.engine.calls] == ["auto", "best"]
        assert (await _outcomes(h))["upgraded"] == 0


class BulkWaits(FakeEngine):
    """Bulk requests (the upgrade's) wait for ``release``; live ones answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.bulk_started = asyncio.Event()

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        if req.priority == "bulk":
            self.bulk_started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().generate(req)


async def test_an_upgrade_gives_way_to_a_live_request_and_is_done_later() -> None:
    engine = BulkWaits()
    async with running_app(engine, **UPGRADE) as h:
        engine.auto_serves = "fast"
        for _ in range(2):
            await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        await asyncio.wait_for(engine.bulk_started.wait(), 5)
        live = await asyncio.wait_for(h.client.post("/v1/couplets", json={"upper": "福满人间万户春"}), 5)
        assert live.status_code == 200 and live.json()["served"] == "fast"
        assert engine.cancelled == 1
        await _until(h, "yielded", 1)
        engine.release.set()  # the engine idles again: the line, put back, is upgraded
        await _until(h, "upgraded", 1)
        r = (await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})).json()
        assert (r["served"], r["cached"]) == ("best", True)


async def test_the_hot_lines_gauge_counts_lines_waiting_for_an_upgrade() -> None:
    engine = BulkWaits()
    async with running_app(engine, idle_upgrade=True, idle_upgrade_after_ms=60_000) as h:
        engine.auto_serves = "fast"
        for upper in ("春回大地千山秀", "春回大地千山秀", "福满人间万户春", "福满人间万户春", "一帆风顺年年好"):
            await h.client.post("/v1/couplets", json={"upper": upper})
        gauge = metric(parse_metrics((await h.client.get("/metrics")).text), "chunlian_hot_lines")
        assert gauge == 2.0


class QueuesFirst(FakeEngine):
    """A request waits in the queue for its batch (``queue_depth`` counts it) before it runs."""

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        self.stats.queue_depth += 1
        try:
            await asyncio.sleep(0.05)  # five of the upgrade's polls
        finally:
            self.stats.queue_depth -= 1
        return await super().generate(req)


async def test_an_upgrade_never_gives_way_to_its_own_queued_request() -> None:
    async with running_app(QueuesFirst(), **UPGRADE) as h:
        h.engine.auto_serves = "fast"
        for _ in range(2):
            await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        await _until(h, "upgraded", 1)
        assert (await _outcomes(h))["yielded"] == 0


async def test_regenerated_answers_do_not_make_a_line_hot() -> None:
    async with running_app(**UPGRADE) as h:
        h.engine.auto_serves = "fast"
        for _ in range(3):
            r = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀", "regenerate": True})
            assert r.status_code == 200
        await asyncio.sleep(0.3)
        assert metric(parse_metrics((await h.client.get("/metrics")).text), "chunlian_hot_lines") == 0.0
        assert all(c.priority == "interactive" for c in h.engine.calls)  # no upgrade ran


async def test_an_error_in_the_loop_does_not_end_the_upgrades(monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_app(**UPGRADE) as h:
        h.engine.auto_serves = "fast"
        hot = h.runtime.service.hot
        take, calls = hot.take, []

        def flaky_take() -> object:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bug in the table")
            return take()

        monkeypatch.setattr(hot, "take", flaky_take)
        for _ in range(2):
            await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        await _until(h, "upgraded", 1)
        assert len(calls) >= 2
