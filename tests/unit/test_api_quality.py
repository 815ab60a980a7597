"""The ``quality`` field over HTTP: its values, bad values, ``served``, the cache rule and
metrics by mode (the fake engine answers each mode with lines of its own)."""

from __future__ import annotations

import pytest

from chunlian.bench.promtext import metric, parse_metrics
from tests.unit.api_fakes import running_app

UPPER = "春回大地千山秀"


@pytest.mark.parametrize(("quality", "served"), [("best", "best"), ("fast", "fast"), ("auto", "best"), (None, "best")])
async def test_each_value_is_served_and_says_so(quality: str | None, served: str) -> None:
    body = {"upper": UPPER} if quality is None else {"upper": UPPER, "quality": quality}
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["served"] == served
        assert h.engine.calls[-1].quality == (quality or "auto")  # no field: auto


async def test_auto_steps_down_when_the_engine_does() -> None:
    async with running_app() as h:
        h.engine.auto_serves = "fast"
        r = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "auto"})
        assert r.json()["served"] == "fast"


@pytest.mark.parametrize("bad", ["great", "BEST", "", 1, None, ["best"]])
async def test_bad_values_get_a_422_naming_the_field(bad: object) -> None:
    async with running_app() as h:
        for path, body in (("/v1/couplets", {"upper": UPPER}), ("/v1/couplets/compose", {"heads": "李明"})):
            r = await h.client.post(path, json={**body, "quality": bad})
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["field"] == "quality", err
        assert h.engine.calls == []


@pytest.mark.parametrize("extra", [{"seed": 3}, {"regenerate": True}])
async def test_best_refuses_sampling_with_a_clear_422(extra: dict[str, object]) -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "best", **extra})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "quality"
        assert "seed" in r.json()["error"]["message"]
        ok = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "auto", **extra})
        assert ok.status_code == 200 and ok.json()["served"] == "fast"  # a seed samples: fast


async def test_a_cached_fast_answer_never_answers_best() -> None:
    async with running_app() as h:
        fast = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "fast"})
        assert fast.json()["served"] == "fast" and not fast.json()["cached"]
        again = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "fast"})
        assert again.json()["cached"] and again.json()["lower"] == fast.json()["lower"]
        best = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "best"})
        assert best.json()["served"] == "best" and not best.json()["cached"]
        assert best.json()["lower"] != fast.json()["lower"]
        assert len(h.engine.calls) == 2


async def test_a_cached_best_answer_serves_every_request() -> None:
    async with running_app() as h:
        best = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "best"})
        for q in ("best", "auto", "fast"):
            r = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": q})
            assert r.json()["cached"], q
            assert r.json()["served"] == "best"
            assert r.json()["lower"] == best.json()["lower"]
        assert len(h.engine.calls) == 1


async def test_n_above_one_in_best_mode_returns_the_engines_candidates() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "best", "n": 3})
        assert r.status_code == 200
        body = r.json()
        assert body["served"] == "best"
        lowers = [c["lower"] for c in body["candidates"]]
        assert len(lowers) == 3 and len(set(lowers)) == 3 and lowers[0] == body["lower"]
        assert h.engine.calls[-1].params.n == 3 and h.engine.calls[-1].params.seed is None


async def test_batch_items_take_quality() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets/batch", json={"items": [
            {"upper": UPPER, "quality": "fast"}, {"upper": "福满人间", "quality": "best"},
            {"upper": UPPER, "quality": "nope"}]})
        res = r.json()["results"]
        assert [x.get("served") for x in res[:2]] == ["fast", "best"]
        assert res[2]["error"]["field"] == "quality"


async def test_answers_are_counted_by_mode_and_source() -> None:
    async with running_app() as h:
        await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "best"})
        await h.client.post("/v1/couplets", json={"upper": UPPER, "quality": "fast"})  # the best one, cached
        await h.client.post("/v1/couplets", json={"upper": "福满人间", "quality": "fast"})
        samples = parse_metrics((await h.client.get("/metrics")).text)
        assert metric(samples, "chunlian_answers_total", served="best", source="engine") == 1
        assert metric(samples, "chunlian_answers_total", served="best", source="cache") == 1
        assert metric(samples, "chunlian_answers_total", served="fast", source="engine") == 1
        assert metric(samples, "chunlian_answers_total", served="good", source="engine") == 0
