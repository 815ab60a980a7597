"""The job endpoints in the embedded (no broker) mode, on the fake engine: submit, poll,
page, cancel, retries, readiness, API keys, the 10,000-item limit, and shut-down with a
job running. The CLI's file reading and result writing too."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chunlian.errors import Overloaded
from chunlian.jobs.backend import chunks
from chunlian.jobs.cli import read_items, write_results
from chunlian.jobs.inprocess import InProcessJobs
from chunlian.jobs.items import MAX_JOB_ITEMS
from tests.unit.api_fakes import FakeEngine
from tests.unit.api_fakes import running_app as _running_app
from tests.unit.test_api_routes import assert_error


def running_app(engine: FakeEngine | None = None, wait_ready: bool = True, **overrides: Any) -> Any:
    """The fake-engine app in the embedded jobs mode, whatever the environment says."""
    return _running_app(engine, wait_ready, broker_url="", **overrides)


UPPERS = [f"春回大地{c}山秀" for c in "一二三四五六七八九十"]


async def wait_finished(client: httpx.AsyncClient, job_id: str, limit_s: float = 20.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        body = (await client.get(f"/v1/jobs/{job_id}", params={"limit": 0})).json()
        p = body["progress"]
        if p["done"] + p["failed"] + p["cancelled"] == p["total"]:
            return body  # type: ignore[no-any-return]
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.01)


async def test_a_job_runs_at_bulk_priority_and_pages_its_results() -> None:
    async with running_app() as h:
        items = [{"upper": u} for u in UPPERS] + [{"heads": "李明", "length": 5}, {"keyword": "新春", "n": 2}]
        r = await h.client.post("/v1/jobs", json={"items": items})
        assert r.status_code == 202 and r.headers["location"] == f"/v1/jobs/{r.json()['job_id']}"
        assert r.json()["status"] == "queued" and r.json()["total"] == 12
        job_id = r.json()["job_id"]
        body = await wait_finished(h.client, job_id)
        assert body["status"] == "done" and body["finished_at"] >= body["started_at"] >= body["created_at"]
        assert body["progress"] == {"done": 12, "failed": 0, "cancelled": 0, "total": 12}
        page = (await h.client.get(f"/v1/jobs/{job_id}", params={"offset": 9, "limit": 2})).json()
        assert (page["offset"], page["limit"]) == (9, 2)
        assert [(x["index"], x["status"]) for x in page["results"]] == [(9, "done"), (10, "done")]
        assert page["results"][0]["upper"] == UPPERS[9] and page["results"][0]["model"] == "fake-couplet@test"
        assert page["results"][1]["upper"].startswith("李")
        last = (await h.client.get(f"/v1/jobs/{job_id}", params={"offset": 11})).json()["results"]
        assert len(last) == 1 and len(last[0]["candidates"]) == 2
        assert {c.priority for c in h.engine.calls} == {"bulk"}


async def test_transient_failures_retry_then_fail_alone() -> None:
    engine = FakeEngine()
    engine.fail[UPPERS[3]] = Overloaded("queue full", retry_after_s=0.0)
    async with running_app(engine) as h:
        jobs = h.client._transport.app.state.jobs  # type: ignore[attr-defined]
        assert isinstance(jobs, InProcessJobs)
        jobs.backoff_s = 0.001
        job_id = (await h.client.post("/v1/jobs", json={"items": [{"upper": u} for u in UPPERS]})).json()["job_id"]
        body = await wait_finished(h.client, job_id)
        assert body["status"] == "done"
        assert body["progress"] == {"done": 9, "failed": 1, "cancelled": 0, "total": 10}
        bad = (await h.client.get(f"/v1/jobs/{job_id}", params={"offset": 3, "limit": 1})).json()["results"][0]
        assert bad["status"] == "failed" and bad["error"]["code"] == "item_failed"
        assert "after 3 tries: overloaded" in bad["error"]["message"]
        assert sum(c.upper == UPPERS[3] for c in engine.calls) == 3
        assert jobs.store.tries(job_id)[3] == 3


async def test_cancel_stops_pending_items_and_frees_the_engine() -> None:
    engine = FakeEngine()
    engine.hold = asyncio.Event()
    async with running_app(engine, max_batch_size=2) as h:  # window: 2 items in the engine
        job_id = (await h.client.post("/v1/jobs", json={"items": [{"upper": u} for u in UPPERS]})).json()["job_id"]
        for _ in range(500):
            if len(engine.calls) == 2:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        assert len(engine.calls) == 2  # the window holds the rest back
        r = await h.client.delete(f"/v1/jobs/{job_id}")
        assert r.status_code == 200
        assert r.json()["status"] == "cancelled"
        assert r.json()["progress"] == {"done": 0, "failed": 0, "cancelled": 10, "total": 10}
        for _ in range(500):
            if engine.cancelled == 2:
                break
            await asyncio.sleep(0.005)
        assert engine.cancelled == 2  # the items in the engine were cancelled
        engine.hold.set()
        await asyncio.sleep(0.05)
        assert len(engine.calls) == 2  # nothing more ran
        body = (await h.client.get(f"/v1/jobs/{job_id}", params={"limit": 3})).json()
        assert [x["status"] for x in body["results"]] == ["cancelled"] * 3


async def test_bulk_items_go_to_the_engine_a_window_at_a_time_at_bulk_priority() -> None:
    """The job runner keeps at most ``max_batch_size`` items in the engine and sends them at
    bulk priority; pacing them beside interactive work is the scheduler's
    (``test_scheduler``: bulk keeps to its share)."""
    engine = FakeEngine()
    engine.hold = asyncio.Event()
    async with running_app(engine, max_batch_size=8, bulk_min_share=0.25) as h:
        jobs = h.client._transport.app.state.jobs  # type: ignore[attr-defined]
        assert jobs.window == 8

        async def calls_reach(n: int) -> None:
            for _ in range(1000):
                if len(engine.calls) >= n:
                    return
                await asyncio.sleep(0.002)

        await h.client.post("/v1/jobs", json={"items": [{"upper": u} for u in UPPERS]})
        await calls_reach(8)
        await asyncio.sleep(0.05)
        assert len(engine.calls) == 8 and jobs.in_flight == 8  # the whole window, no more
        assert {c.priority for c in engine.calls} == {"bulk"}
        engine.hold.set()


async def test_shut_down_with_a_job_running_is_clean() -> None:
    engine = FakeEngine()
    engine.hold = asyncio.Event()
    async with running_app(engine) as h:
        r = await h.client.post("/v1/jobs", json={"items": [{"upper": u} for u in UPPERS]})
        assert r.status_code == 202
        await asyncio.sleep(0.02)
    assert engine.stopped  # the lifespan closed the jobs, then stopped the engine


async def test_not_ready_is_503_in_process() -> None:
    engine = FakeEngine()
    engine.start_gate = asyncio.Event()
    async with running_app(engine, wait_ready=False) as h:
        r = await h.client.post("/v1/jobs", json={"items": [{"upper": UPPERS[0]}]})
        assert_error(r, 503, "not_ready")
        engine.start_gate.set()


async def test_limits_and_bad_bodies() -> None:
    async with running_app(body_limit_bytes=2_000_000) as h:
        full = [{"upper": "春回大地千山秀"}] * MAX_JOB_ITEMS
        r = await h.client.post("/v1/jobs", json={"items": full})
        assert r.status_code == 202 and r.json()["total"] == MAX_JOB_ITEMS
        await h.client.delete(f"/v1/jobs/{r.json()['job_id']}")
        assert_error(await h.client.post("/v1/jobs", json={"items": full + full[:1]}), 422, "invalid_input", "items")
        assert_error(await h.client.post("/v1/jobs", json={"items": [{"upper": "春"}, {"heads": "欧阳小明明"}]}),
                     422, "invalid_input", "items.1.heads")
        assert_error(await h.client.post("/v1/jobs", json={"items": [None]}), 422, "invalid_input", "items.0")
        assert_error(await h.client.post("/v1/jobs", json={"items": [{"upper": "春回", "n": 9}]}),
                     422, "invalid_input", "items.0.n")
        assert_error(await h.client.get("/v1/jobs/abc", params={"limit": "x"}), 422, "invalid_input", "limit")
        assert_error(await h.client.get("/v1/jobs/abc"), 404, "not_found", "job_id")


async def test_the_newest_jobs_are_listed_without_results() -> None:
    async with running_app() as h:
        ids = []
        for k in range(3):
            r = await h.client.post("/v1/jobs", json={"items": [{"upper": u} for u in UPPERS[:k + 1]]})
            ids.append(r.json()["job_id"])
        for job_id in ids:
            await wait_finished(h.client, job_id)
        r = await h.client.get("/v1/jobs", params={"limit": 2})
        assert r.status_code == 200
        jobs = r.json()["jobs"]
        assert [j["job_id"] for j in jobs] == ids[::-1][:2] and all("results" not in j for j in jobs)
        assert [j["progress"]["total"] for j in jobs] == [3, 2] and {j["status"] for j in jobs} == {"done"}
        assert [j["job_id"] for j in (await h.client.get("/v1/jobs")).json()["jobs"]] == ids[::-1]
        for bad in ("0", "101", "x"):
            assert_error(await h.client.get("/v1/jobs", params={"limit": bad}), 422, "invalid_input", "limit")
    async with running_app(api_keys="k1") as h:
        assert_error(await h.client.get("/v1/jobs"), 401, "unauthorized")
        assert (await h.client.get("/v1/jobs", headers={"X-API-Key": "k1"})).json() == {"jobs": []}


async def test_api_keys() -> None:
    async with running_app(api_keys=" k1 , k2 ") as h:
        assert_error(await h.client.post("/v1/jobs", json={"items": "x"}), 401, "unauthorized")
        r = await h.client.post("/v1/jobs", json={"items": "x"}, headers={"X-API-Key": "k2"})
        assert_error(r, 422, "invalid_input", "items")  # authorised: now the body is checked
        assert (await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})).status_code == 200
        assert (await h.client.post("/v1/couplets/compose", json={"heads": "李明"})).status_code == 200
        # the batch endpoint is bulk work too (256 couplets a call): it takes the key
        batch = {"items": [{"upper": "春回大地千山秀"}]}
        assert_error(await h.client.post("/v1/couplets/batch", json=batch), 401, "unauthorized")
        assert_error(await h.client.post("/v1/couplets/batch", json=batch, headers={"X-API-Key": "nope"}),
                     401, "unauthorized")
        r = await h.client.post("/v1/couplets/batch", json=batch, headers={"X-API-Key": "k1"})
        assert r.status_code == 200 and r.json()["results"][0]["upper"] == "春回大地千山秀"
    async with running_app() as h:  # no keys configured: open
        r = await h.client.post("/v1/jobs", json={"items": [{"upper": "春回大地千山秀"}]})
        assert r.status_code == 202
        assert (await h.client.post("/v1/couplets/batch", json={"items": [{"upper": "春回大地千山秀"}]})).status_code == 200


def test_jobs_are_split_into_chunks_in_order() -> None:
    specs = [{"upper": u} for u in UPPERS]
    parts = chunks(specs, 4)
    assert [len(p) for p in parts] == [4, 4, 2]
    assert [i for p in parts for i, _ in p] == list(range(10))


def test_cli_reads_lines_and_tsv(tmp_path: Path) -> None:
    plain = tmp_path / "a.txt"
    plain.write_text("春回大地千山秀\n\n# a comment\n天增岁月人增寿\tignored\n", encoding="utf-8")
    assert read_items(plain, "business") == [
        {"upper": "春回大地千山秀", "style": "business"}, {"upper": "天增岁月人增寿", "style": "business"}]
    tsv = tmp_path / "b.tsv"
    tsv.write_text("heads\tlength\tstyle\n李明\t5\tfamily\n王芳\t7\t\n", encoding="utf-8")
    assert read_items(tsv, None) == [{"heads": "李明", "length": 5, "style": "family"},
                                     {"heads": "王芳", "length": 7}]


def test_cli_writes_jsonl_and_csv(tmp_path: Path) -> None:
    results = [
        {"index": 0, "status": "done", "upper": "春回大地千山秀", "lower": "福满人间万户新", "hengpi": "万象更新",
         "style": "traditional", "model": "m@1"},
        {"index": 1, "status": "failed", "error": {"code": "time_limit", "message": "killed", "field": None}},
    ]
    write_results(results, tmp_path / "r.jsonl")
    lines = (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == results
    write_results(results, tmp_path / "r.csv")
    rows = list(csv.DictReader((tmp_path / "r.csv").open(encoding="utf-8")))
    assert rows[0]["lower"] == "福满人间万户新" and rows[1]["error_code"] == "time_limit"


def test_cli_registers_its_commands() -> None:
    from chunlian.cli import build_parser

    p = build_parser()
    a = p.parse_args(["jobs", "submit", "f.txt", "--style", "family", "--wait", "--out", "r.csv", "--url", "http://x"])
    assert (a.file, a.style, a.wait, a.out, a.url) == ("f.txt", "family", True, "r.csv", "http://x")
    w = p.parse_args(["worker", "--concurrency", "2", "--loglevel", "WARNING"])
    assert (w.concurrency, w.log_level) == (2, "WARNING")


def test_worker_without_a_broker_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from chunlian.cli import main
    from chunlian.jobs import celery_app

    monkeypatch.delenv("CHUNLIAN_BROKER_URL", raising=False)
    monkeypatch.setattr(celery_app, "_app", None)
    assert main(["worker"]) == 2
    assert "CHUNLIAN_BROKER_URL" in capsys.readouterr().err


def test_visibility_timeout_is_sized_above_the_hard_limit() -> None:
    from chunlian.config import load_settings
    from chunlian.errors import ConfigError
    from chunlian.jobs.celery_app import make_celery, visibility_timeout_s

    s = load_settings(broker_url="redis://127.0.0.1:6379/11")
    assert visibility_timeout_s(s) == 120
    app = make_celery(s)
    c = app.conf
    assert c.task_acks_late and c.task_reject_on_worker_lost and c.worker_prefetch_multiplier == 1
    assert (c.task_soft_time_limit, c.task_time_limit) == (30, 60)
    assert c.result_expires == 7 * 24 * 3600
    assert c.broker_transport_options["visibility_timeout"] == 120
    with pytest.raises(ConfigError, match="VISIBILITY"):
        visibility_timeout_s(load_settings(broker_url="redis://x:1/0", job_visibility_timeout_s=62))
