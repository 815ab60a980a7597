"""Backpressure and deadlines through real HTTP with the real engine.

``max_batch_size=1, max_queue_size=2``. A step listener holds the engine thread after a
step while the test sends its burst, so the outcome does not depend on timing: with one
request running and the engine held, exactly two more fit in the queue and the rest of
the burst must be refused with 429 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine
from tests.integration.live_server import LiveServer, model_path
from tests.reliability.harness.services import Hold
from tests.unit.test_api_metrics import sample
from tests.unit.test_api_routes import assert_error

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UPPERS = [
    "春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海",
    "万事如意步步高", "梅花点点迎新春", "东风送暖", "瑞雪丰年", "家和万事兴",
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Hold]]:
    settings = load_settings(
        model_path=model_path(tmp_path_factory.mktemp("model")), device="cpu",
        max_batch_size=1, max_queue_size=2, warmup=(), torch_threads=1,
    )
    engine = Engine.from_config(EngineConfig.from_settings(settings))
    hold = Hold()
    engine.add_step_listener(hold)
    server = LiveServer(settings, engine).start()
    try:
        server.wait_ready()
        yield server, hold
    finally:
        hold.open()
        server.stop()


async def _held_engine(client: httpx.AsyncClient, hold: Hold, body: dict[str, Any]) -> asyncio.Task[httpx.Response]:
    """Send ``body`` and return once the engine is parked right after its first step."""
    hold.arm()
    task = asyncio.create_task(client.post("/v1/couplets", json=body))
    assert await asyncio.to_thread(hold.held.wait, 60), "the engine never stepped"
    return task


async def test_queue_full_gives_429_with_retry_after(live: tuple[LiveServer, Hold]) -> None:
    server, hold = live
    burst = 6
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        rejected0 = sample((await client.get("/metrics")).text, "chunlian_overload_rejections_total")
        try:
            first = await _held_engine(client, hold, {"upper": UPPERS[0], "regenerate": True})
            tasks = [
                asyncio.create_task(client.post("/v1/couplets", json={"upper": u, "regenerate": True}))
                for u in UPPERS[1 : 1 + burst]
            ]
            # With the engine parked, only refusals can come back: wait for all of them.
            done: set[asyncio.Task[httpx.Response]] = set()
            while len(done) < burst - 2:
                finished, _ = await asyncio.wait(set(tasks) - done, timeout=60, return_when=asyncio.FIRST_COMPLETED)
                assert finished, "the refusals did not arrive"
                done |= finished
            refusals = [t.result() for t in done]
            metrics_while_held = (await client.get("/metrics")).text
        finally:
            hold.open()
        rest = await asyncio.gather(first, *(t for t in tasks if t not in done))

    assert len(refusals) == burst - 2
    for r in refusals:
        assert_error(r, 429, "overloaded")
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
        assert r.headers["x-request-id"]
    assert [r.status_code for r in rest] == [200, 200, 200]
    assert sample(metrics_while_held, "chunlian_queue_depth") == 2
    assert sample(metrics_while_held, "chunlian_queue_capacity") == 2
    after = httpx.get(server.base_url + "/metrics").text
    assert sample(after, "chunlian_overload_rejections_total") == rejected0 + burst - 2
    assert sample(after, "chunlian_http_requests_total", endpoint="/v1/couplets", status="429") >= burst - 2


async def test_deadline_passed_while_held_gives_504(live: tuple[LiveServer, Hold]) -> None:
    server, hold = live
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        try:
            task = await _held_engine(client, hold, {"upper": UPPERS[1], "timeout_ms": 50, "regenerate": True})
            r = await asyncio.wait_for(task, 60)  # the engine stays parked: no answer can arrive
        finally:
            hold.open()
        assert_error(r, 504, "deadline_exceeded")
        ok = await client.post("/v1/couplets", json={"upper": UPPERS[2]})
        assert ok.status_code == 200  # the engine carries on afterwards


async def test_client_gone_frees_its_slot(live: tuple[LiveServer, Hold]) -> None:
    server, hold = live

    def metrics() -> str:
        return httpx.get(server.base_url + "/metrics", timeout=30).text

    gone0 = sample(metrics(), "chunlian_http_requests_total", endpoint="/v1/couplets", status="499")
    cancelled0 = sample(metrics(), "chunlian_cancelled_requests_total")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            task = await _held_engine(client, hold, {"upper": UPPERS[3], "regenerate": True})
            task.cancel()  # the caller goes away mid-generation
            with pytest.raises(asyncio.CancelledError):
                await task
        # the handler notices the closed connection and cancels the generation
        for _ in range(600):
            if sample(metrics(), "chunlian_http_requests_total", endpoint="/v1/couplets", status="499") > gone0:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the server never noticed the client leaving")
    finally:
        hold.open()
    for _ in range(600):
        if sample(metrics(), "chunlian_cancelled_requests_total") > cancelled0:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the engine never cancelled the abandoned request")
    ok = httpx.post(server.base_url + "/v1/couplets", json={"upper": UPPERS[4]}, timeout=60)
    assert ok.status_code == 200
