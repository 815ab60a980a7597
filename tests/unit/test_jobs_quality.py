"""Quality jobs (``jobs.quality``): which items may ask for the mode, how a worker's executor
routes them (order kept), the sub-batch size of a quality chunk, and the embedded runner's
tries, failures and cancellation -- on fakes; ``tests/integration`` runs the real models."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from chunlian.errors import ChunlianError, InvalidInput, ModelError
from chunlian.jobs.items import Spec, validate_items
from chunlian.jobs.quality import QUALITY_SUB_BATCH, is_quality
from chunlian.jobs.store import MemoryJobStore
from chunlian.jobs.worker import LocalExecutor, Outcome, process_chunk, split_run
from chunlian.types import Couplet, CoupletResult
from tests.unit.test_jobs_api import UPPERS, running_app, wait_finished
from tests.unit.test_jobs_worker import FakeExecutor


def result(upper: str, tag: str) -> CoupletResult:
    return CoupletResult(Couplet(upper, "下" * len(upper), "万象更新", "traditional"), (), tag)


class FakeQuality:
    """A quality runner: ``fail_times`` whole-batch failures first; ``bad`` items answer an error."""

    def __init__(self, fail_times: int = 0, bad: Sequence[str] = (), hold: asyncio.Event | None = None) -> None:
        self.fail_times = fail_times
        self.bad = set(bad)
        self.hold = hold
        self.calls: list[list[str]] = []
        self.closed = False

    async def run(self, specs: Sequence[Spec]) -> list[CoupletResult | ChunlianError]:
        self.calls.append([s["upper"] for s in specs])
        assert all(is_quality(s) for s in specs)
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_times > 0:
            self.fail_times -= 1
            raise RuntimeError("the quality child died")
        return [ModelError("no couplet satisfied the rules") if s["upper"] in self.bad
                else result(s["upper"], "quality@test") for s in specs]

    def close(self) -> None:
        self.closed = True


def test_the_items_the_quality_mode_can_answer_are_marked_for_it() -> None:
    items = [{"upper": "春回大地千山秀"}, {"upper": "生意兴隆通四海", "style": "business"}, {"heads": "李明"},
             {"keyword": "新春"}, {"upper": "春回大地千山秀", "n": 3}, {"upper": "天增岁月人增寿", "seed": 7}]
    specs = validate_items(items)  # the default: best
    assert [s.get("quality") for s in specs] == [True, True, True, True, None, None]  # composed: two stages
    assert specs[1]["style"] == "business"
    assert not any("quality" in s for s in validate_items(items, quality=False))
    with pytest.raises(InvalidInput) as e:  # the item's own rules still come first
        validate_items([{"upper": "hello"}])
    assert e.value.field == "items.0.upper"


def test_an_executor_routes_quality_items_and_keeps_the_order() -> None:
    seen: dict[str, list[str]] = {"plain": [], "quality": []}

    def run(kind: str) -> Any:
        def f(specs: Sequence[Spec]) -> list[Outcome]:
            seen[kind] += [s["upper"] for s in specs]
            return [result(s["upper"], kind) for s in specs]
        return f

    specs: list[Spec] = [{"upper": u, **({"quality": True} if k % 3 == 0 else {})} for k, u in enumerate(UPPERS)]
    out = split_run(specs, run("plain"), run("quality"))
    assert [o.best.upper for o in out if isinstance(o, CoupletResult)] == UPPERS
    assert [o.model for o in out if isinstance(o, CoupletResult)] == [
        "quality" if k % 3 == 0 else "plain" for k in range(len(UPPERS))]
    assert seen["quality"] == UPPERS[::3] and len(seen["plain"]) == len(UPPERS) - len(UPPERS[::3])
    seen = {"plain": [], "quality": []}
    split_run(specs[:1], run("plain"), run("quality"))
    split_run(specs[1:2], run("plain"), run("quality"))
    assert seen == {"plain": [UPPERS[1]], "quality": [UPPERS[0]]}


def test_a_local_executor_sends_quality_items_to_its_quality_models() -> None:
    class Gen:
        def generate(self, reqs: list[Any]) -> list[Any]:
            raise AssertionError("the greedy model got a quality item")

    class Quality:
        def run(self, specs: Sequence[Spec]) -> list[Outcome]:
            return [result(s["upper"], "quality@test") for s in specs]

    ex = LocalExecutor(Gen(), 16, Quality())
    out = ex.run([{"upper": u, "quality": True} for u in UPPERS[:3]])
    assert [o.model for o in out if isinstance(o, CoupletResult)] == ["quality@test"] * 3


def test_a_quality_chunk_runs_and_records_in_small_sub_batches() -> None:
    store = MemoryJobStore(ttl_s=3600)
    store.create("j", 20)
    ex = FakeExecutor(batch_size=50)
    texts = [f"春回大地{i:02d}山秀" for i in range(20)]
    report = process_chunk("j", [(i, {"upper": t, "quality": True}) for i, t in enumerate(texts)], store, ex)
    assert report.done == 20
    assert [len(c) for c in ex.calls] == [QUALITY_SUB_BATCH, QUALITY_SUB_BATCH, 20 - 2 * QUALITY_SUB_BATCH]
    plain = FakeExecutor(batch_size=50)
    store.create("k", 20)
    process_chunk("k", [(i, {"upper": t}) for i, t in enumerate(texts)], store, plain)
    assert [len(c) for c in plain.calls] == [20]


async def test_an_embedded_job_asks_the_engine_for_best_at_bulk_priority_and_says_what_served() -> None:
    async with running_app() as h:
        items = [{"upper": UPPERS[0]}, {"heads": "李明"}, {"upper": UPPERS[1], "seed": 4}]
        # fast first: a cached best answer would answer a fast item too (``api.service``)
        for quality, first in ((False, "fast"), ("fast", "fast"), (None, "best"), (True, "best"),
                               ("best", "best"), ("auto", "best")):
            h.engine.calls.clear()
            body: dict[str, object] = {"items": items, **({} if quality is None else {"quality": quality})}
            r = await h.client.post("/v1/jobs", json=body)
            assert r.status_code == 202, r.text
            await wait_finished(h.client, r.json()["job_id"])
            res = (await h.client.get(f"/v1/jobs/{r.json()['job_id']}")).json()["results"]
            assert [x["served"] for x in res] == [first, first, "fast"], quality  # a name: composed in best
            assert {c.priority for c in h.engine.calls} <= {"bulk"}
        bad = await h.client.post("/v1/jobs", json={"items": [{"upper": UPPERS[0]}], "quality": "yes"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "quality"


def test_a_quality_model_loads_once_and_an_engine_url_worker_runs_it_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from chunlian.jobs import quality as Q
    from chunlian.jobs.worker import HttpExecutor
    from chunlian.offline import OfflineGenerator

    events: list[str] = []

    class Runner:
        n_live = 0

    class Gen:
        runner = Runner()
        loaded = type("L", (), {"tag": "quality@test"})()

        def generate(self, reqs: list[Any]) -> list[Any]:
            events.append(f"generate {len(reqs)}")
            return [result(r.upper, "quality@test") for r in reqs]

    def load_quality(device: str = "cpu", capacity: int = 64, blocklist: Any = None) -> Gen:
        events.append("load")
        return Gen()

    monkeypatch.setattr(OfflineGenerator, "load_quality", staticmethod(load_quality))
    monkeypatch.setattr(os, "sched_setscheduler", lambda pid, policy, param: events.append(f"policy {policy}"))
    ex = HttpExecutor("http://127.0.0.1:9", client=object())
    assert ex.quality.idle
    specs = [{"upper": u, "quality": True} for u in UPPERS[:2]]
    assert [o.model for o in ex.run(specs) if isinstance(o, CoupletResult)] == ["quality@test"] * 2
    ex.run(specs)
    assert events == [f"policy {os.SCHED_IDLE}", "load", "generate 2", "generate 2"]
    events.clear()
    Q.QualityModel().run(specs)  # a worker with its own model keeps its nice (WORKER_NICE)
    assert events == ["load", "generate 2"]
