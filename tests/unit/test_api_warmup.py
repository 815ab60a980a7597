"""Warm-up: which requests an entry list means, and warming a running service over HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from chunlian.api.warmup import read_warmup_file, warmup_bodies, warmup_remote, warmup_requests
from tests.unit.api_fakes import running_app


def test_short_entries_are_keywords_long_ones_upper_lines() -> None:
    bodies = warmup_bodies(["新春", " 福 ", "恭喜发财", "春回大地千山秀", "", "平安"])
    assert bodies == [
        {"keyword": "新春", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "新春", "length": 5, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "福", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "福", "length": 5, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "恭喜发财", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "恭喜发财", "length": 5, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"upper": "春回大地千山秀", "style": "traditional", "n": 4, "timeout_ms": 60_000, "quality": "best"},
        {"keyword": "平安", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000},
        {"keyword": "平安", "length": 5, "style": "traditional", "n": 4, "timeout_ms": 60_000},
    ]


def test_names_are_composed_in_the_best_mode_as_the_page_asks() -> None:
    assert warmup_bodies(["name:王秀英", " name: 李 明 ", "name:"])[:2] == [
        {"heads": "王秀英", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000, "quality": "best"},
        {"heads": "李明", "length": 7, "style": "traditional", "n": 4, "timeout_ms": 60_000, "quality": "best"},
    ]
    reqs = warmup_requests(["name:王秀英", "name:丹丹", "name:Wang", "name:"])
    assert [(r.heads, r.length, r.quality, r.params.n, r.timeout_s) for r in reqs] == [
        ("秀英", 7, "best", 4, 60.0), ("丹丹", 7, "best", 4, 60.0)]  # warm-up waits its turn


def test_bad_entries_are_skipped_not_fatal() -> None:
    reqs = warmup_requests(["hello world", "春回大地千山秀", "春" * 40])
    assert [r.upper for r in reqs] == ["春回大地千山秀"]


def test_read_warmup_file(tmp_path: Path) -> None:
    f = tmp_path / "hot.txt"
    f.write_text("# hot words\n新春\n\n  春回大地千山秀  \n", encoding="utf-8")
    assert read_warmup_file(f) == ["新春", "春回大地千山秀"]


async def test_warmup_remote_fills_the_cache_of_a_running_service() -> None:
    async with running_app(body_limit_bytes=100_000) as h:
        transport = httpx.ASGITransport(app=h.client._transport.app)  # type: ignore[attr-defined]
        async with httpx.AsyncClient(transport=transport) as client:
            report = await warmup_remote("http://unit/", ["新春", "春回大地千山秀", "abc"], client=client)
        assert report.requested == 4
        assert report.ok == 3 and report.failed == 1 and report.cached == 0
        assert "invalid_input" in report.errors[0]
        calls = len(h.engine.calls)
        r = await h.client.post("/v1/couplets/compose", json={"keyword": "新春", "length": 5, "n": 4})
        assert r.json()["cached"] is True
        assert len(h.engine.calls) == calls
        async with httpx.AsyncClient(transport=transport) as client:
            again = await warmup_remote("http://unit", ["新春"], client=client)
        assert again.ok == 2 and again.cached == 2


async def test_warmup_remote_reports_an_unreachable_service() -> None:
    report = await warmup_remote("http://127.0.0.1:9", ["新春"], timeout_s=2.0)
    assert report.ok == 0 and report.failed == 2 and report.errors


async def test_start_up_heap_is_frozen_once_ready_when_asked() -> None:
    import gc

    gc.unfreeze()
    try:
        async with running_app(gc_freeze=True) as h:
            assert h.runtime.ready
            assert gc.get_freeze_count() > 1000  # the framework and the app, at least
        gc.unfreeze()
        async with running_app(gc_freeze=False):
            assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def _scripted(answers: list[httpx.Response], sent: list[list[dict[str, object]]]) -> httpx.AsyncClient:
    """A client whose every request gets the next of ``answers``; the items sent are kept."""
    import json

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["items"])
        return answers.pop(0)
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def _results(*codes: str | None) -> httpx.Response:
    return httpx.Response(200, json={"results": [
        {"upper": "春回大地千山秀", "lower": "x", "cached": False} if c is None
        else {"error": {"code": c, "message": f"{c}!", "field": None}} for c in codes]})


async def test_warmup_remote_waits_out_refusals_and_sends_items_refused_for_load_again() -> None:
    sent: list[list[dict[str, object]]] = []
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)
    answers = [httpx.Response(429, headers={"Retry-After": "3"}, json={}),  # whole batch refused
               _results(None, "overloaded", "invalid_input", None, "engine_stopped"),
               _results("overloaded", None),  # the two refused for load, sent again
               _results(None)]
    entries = ["春回大地千山秀", "一帆风顺年年好", "天增岁月人增寿", "福满人间喜事多", "爆竹声中辞旧岁"]
    async with _scripted(answers, sent) as client:
        report = await warmup_remote("http://unit", entries, client=client, sleep=sleep)
    assert [len(s) for s in sent] == [5, 5, 2, 1]
    assert [b["upper"] for b in sent[2]] == ["一帆风顺年年好", "爆竹声中辞旧岁"]
    assert sent[3] == [{"upper": "一帆风顺年年好", "style": "traditional", "n": 4, "timeout_ms": 60_000, "quality": "best"}]
    assert waits == [3.0, 2.0, 4.0]  # Retry-After, then the doubling back-off of tries 1 and 2
    assert (report.ok, report.failed) == (4, 1) and report.errors == ["invalid_input: invalid_input!"]


async def test_warmup_remote_gives_up_after_its_retries_and_reports_the_refusal() -> None:
    from chunlian.retry import MAX_RETRIES, MAX_RETRY_WAIT_S

    sent: list[list[dict[str, object]]] = []
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)
    answers = [httpx.Response(503, headers={"Retry-After": "600"}, json={})] * (MAX_RETRIES + 1)
    async with _scripted(answers, sent) as client:
        report = await warmup_remote("http://unit", ["春回大地千山秀"], client=client, sleep=sleep)
    assert len(sent) == MAX_RETRIES + 1 and waits == [MAX_RETRY_WAIT_S] * MAX_RETRIES
    assert (report.ok, report.failed) == (0, 1) and report.errors[0].startswith("HTTP 503")


async def test_warmup_remote_keeps_batches_in_flight_and_reports_progress() -> None:
    import asyncio
    import json

    in_flight, most, sent = 0, 0, 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most, sent
        items = json.loads(request.content)["items"]
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        sent += len(items)
        return _results(*[None] * len(items))
    progress: list[tuple[int, int]] = []
    entries = [f"春回大地千山秀{i}" for i in range(1000)]  # 4 batches of at most 256
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        report = await warmup_remote("http://unit", entries, client=client, batches_in_flight=3,
                                     on_progress=lambda done, total: progress.append((done, total)))
    assert most == 3 and sent == 1000 and (report.ok, report.failed) == (1000, 0)
    assert [t for _, t in progress] == [1000] * 4 and progress[-1][0] == 1000
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)


def test_the_warmup_command_refuses_a_bad_batches_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    from chunlian.cli import main

    for bad in ("0", "x", "65"):
        with pytest.raises(SystemExit) as e:
            main(["warmup", "--url", "http://127.0.0.1:9", "--batches-in-flight", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--batches-in-flight" in err and err.count("\n") <= 3


async def test_warmup_remote_reports_a_200_that_is_not_the_service() -> None:
    sent: list[list[dict[str, object]]] = []
    answers = [httpx.Response(200, text="<html>captive portal</html>"), httpx.Response(200, json={"results": []})]
    async with _scripted(answers, sent) as client:
        report = await warmup_remote("http://unit", ["春回大地千山秀"], client=client)
        again = await warmup_remote("http://unit", ["春回大地千山秀"], client=client)
    assert (report.ok, report.failed) == (0, 1) and "captive portal" in report.errors[0]
    assert (again.ok, again.failed) == (0, 1) and "without a result per item" in again.errors[0]
