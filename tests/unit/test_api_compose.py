"""Composed couplets over HTTP (the fake engine): ``quality`` × compose, ``served``, the cache
rule, ``n`` > 1, the name convention (2-4 characters, repeated characters) and the refusal of
a blocked name. The two stages of the quality modes are seen in the engine's calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunlian.engine.composed import UPPER_SEARCH
from tests.unit.api_fakes import running_app

COMPOSE = "/v1/couplets/compose"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("quality", "served"), [("best", "best"), ("fast", "fast"), ("auto", "best"), (None, "best")])
async def test_compose_is_served_in_each_quality_and_says_so(quality: str | None, served: str) -> None:
    body = {"heads": "李明"} if quality is None else {"heads": "李明", "quality": quality}
    async with running_app() as h:
        r = await h.client.post(COMPOSE, json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["served"] == served
        assert out["upper"][0] == "李" and out["lower"][0] == "明"
        calls = h.engine.calls
        if served == "fast":  # one sequence, 上联 then 下联
            assert len(calls) == 1 and calls[0].upper is None and calls[0].params.beam is None
            return
        # the quality modes: the 上联 searched under its head, then answered like a typed one
        search, answer = calls
        assert search.upper is None and search.heads == "李明" and search.params.beam == UPPER_SEARCH
        assert search.quality == "fast"
        assert answer.upper == out["upper"] and answer.heads == "李明" and answer.quality == (quality or "auto")


async def test_auto_compose_steps_down_with_the_engine() -> None:
    async with running_app() as h:
        h.engine.auto_serves = "fast"
        r = await h.client.post(COMPOSE, json={"heads": "李明", "quality": "auto"})
        assert r.json()["served"] == "fast"


async def test_a_cached_fast_composed_answer_never_answers_best() -> None:
    async with running_app() as h:
        fast = (await h.client.post(COMPOSE, json={"keyword": "新春", "quality": "fast"})).json()
        again = (await h.client.post(COMPOSE, json={"keyword": "新春", "quality": "fast"})).json()
        assert again["cached"] and again["lower"] == fast["lower"] and again["served"] == "fast"
        best = (await h.client.post(COMPOSE, json={"keyword": "新春", "quality": "best"})).json()
        assert best["served"] == "best" and not best["cached"] and best["lower"] != fast["lower"]
        assert len(h.engine.calls) == 3  # fast once; best's two stages


async def test_a_cached_best_composed_answer_serves_every_quality() -> None:
    async with running_app() as h:
        best = (await h.client.post(COMPOSE, json={"heads": "王秀英", "quality": "best"})).json()
        for q in ("best", "auto", "fast"):
            r = (await h.client.post(COMPOSE, json={"heads": "王秀英", "quality": q})).json()
            assert r["cached"] and r["served"] == "best" and r["lower"] == best["lower"], q
        assert len(h.engine.calls) == 2


async def test_n_above_one_returns_distinct_reranked_couplets() -> None:
    async with running_app() as h:
        r = await h.client.post(COMPOSE, json={"heads": "李明", "quality": "best", "n": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        pairs = [(c["upper"], c["lower"]) for c in body["candidates"]]
        assert len(pairs) == 4 and len(set(pairs)) == 4
        assert pairs[0] == (body["upper"], body["lower"])
        assert all(u[0] == "李" and lo[0] == "明" for u, lo in pairs)
        assert h.engine.calls[-1].params.n == 4 and h.engine.calls[-1].quality == "best"


@pytest.mark.parametrize(("name", "heads"), [
    ("王秀英", "秀英"), ("李建军", "建军"), ("李丹丹", "丹丹"), ("丹丹", "丹丹"), ("胡军", "胡军"),
    ("欧阳修", "修"), ("欧阳娜娜", "娜娜"), ("明", "明"),
])
@pytest.mark.parametrize("quality", ["fast", "best"])
async def test_full_names_head_the_lines_by_the_convention(name: str, heads: str, quality: str) -> None:
    async with running_app() as h:
        r = await h.client.post(COMPOSE, json={"heads": name, "quality": quality})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["upper"][0] == heads[0]
        if len(heads) == 2:
            assert body["lower"][0] == heads[1]
        assert all(c.heads == heads for c in h.engine.calls)


@pytest.mark.parametrize("name", ["欧阳小明明", "Wang", "王，伟", ""])
async def test_a_name_that_is_no_name_gets_a_422_naming_the_field(name: str) -> None:
    async with running_app() as h:
        r = await h.client.post(COMPOSE, json={"heads": name, "quality": "best"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "heads"
        assert h.engine.calls == []


@pytest.mark.parametrize("name", ["王八蛋", "王傻逼", "婊子"])
async def test_a_vulgar_head_gets_a_422_naming_the_field(name: str) -> None:
    async with running_app() as h:
        for q in ("best", "fast"):
            r = await h.client.post(COMPOSE, json={"heads": name, "quality": q})
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["field"] == "heads" and "term" in err["message"], err
        assert h.engine.calls == []


async def test_the_batch_endpoint_takes_composed_items_in_best() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets/batch", json={"items": [
            {"heads": "王秀英", "quality": "best"}, {"keyword": "新春", "quality": "fast"}]})
        res = r.json()["results"]
        assert [x["served"] for x in res] == ["best", "fast"]
        assert res[0]["upper"][0] == "秀" and res[0]["lower"][0] == "英"


@pytest.mark.parametrize(("rows", "replicas", "width"), [(4, 1, 4), (8, 2, 4), (128, 2, 8)])
async def test_the_upper_search_fits_each_replicas_rows(rows: int, replicas: int, width: int) -> None:
    async with running_app(max_batch_size=rows, engine_replicas=replicas) as h:
        r = await h.client.post(COMPOSE, json={"heads": "李明", "quality": "best"})
        assert r.status_code == 200, r.text
        assert h.engine.calls[0].params.beam is not None and h.engine.calls[0].params.beam.width == width


async def test_without_search_rows_compose_is_written_fast_in_one_request() -> None:
    async with running_app(beam_rows=0) as h:
        r = await h.client.post(COMPOSE, json={"heads": "李明", "quality": "auto"})
        assert r.status_code == 200, r.text
        assert len(h.engine.calls) == 1 and h.engine.calls[0].params.beam is None


async def test_auto_compose_is_one_greedy_sequence_while_requests_wait() -> None:
    async with running_app() as h:
        h.engine.stats.queue_depth = 3  # a backlog: the 上联 search would take its rows
        r = await h.client.post(COMPOSE, json={"heads": "李明", "quality": "auto"})
        assert r.json()["served"] == "fast"
        assert len(h.engine.calls) == 1 and h.engine.calls[0].params.beam is None
        best = await h.client.post(COMPOSE, json={"heads": "王秀英", "quality": "best"})
        assert best.json()["served"] == "best" and len(h.engine.calls) == 3  # best is searched whatever the load


async def test_none_of_the_500_most_common_full_names_is_refused() -> None:
    rows = (ROOT / "data" / "campaign" / "names.tsv").read_text(encoding="utf-8").splitlines()[1:501]
    names = [r.split("\t")[1] for r in rows]
    assert len(names) == 500 and sum(len(n) == 3 for n in names) > 100
    async with running_app() as h:
        refused = []
        for name in names:
            r = await h.client.post(COMPOSE, json={"heads": name, "quality": "fast"})
            if r.status_code != 200:
                refused.append((name, r.text))
                continue
            # the given name heads the lines (a 3-character name's surname is not written)
            out = r.json()
            assert (out["upper"][0], out["lower"][0]) == (name[-2], name[-1]), name
    assert refused == []
