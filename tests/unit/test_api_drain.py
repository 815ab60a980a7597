"""Drain (``api.drain``): once it begins, readiness fails, new /v1/ work is refused with 503
``shutting_down`` + ``Retry-After``, answers close their connection, and a request already in
flight still gets its answer; the server's drain waits for it and then asks uvicorn to stop.
The signal, the real server and the exit status: ``tests/integration/test_drain.py``."""

from __future__ import annotations

import asyncio

import uvicorn

from chunlian.api.drain import Drain, DrainingServer
from tests.unit.api_fakes import FakeEngine, running_app
from tests.unit.test_api_routes import assert_error


async def test_draining_refuses_new_work_and_finishes_what_is_in_flight() -> None:
    engine = FakeEngine()
    async with running_app(engine) as h:
        assert (await h.client.get("/readyz")).status_code == 200
        engine.hold = asyncio.Event()
        in_flight = asyncio.create_task(h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"}))
        while h.runtime.drain.in_flight == 0:
            await asyncio.sleep(0.01)
        h.runtime.begin_drain()
        ready = await h.client.get("/readyz")
        assert_error(ready, 503, "shutting_down")
        assert ready.headers["retry-after"] == "1" and ready.headers["connection"] == "close"
        assert "chunlian_ready 0.0" in (await h.client.get("/metrics")).text
        for path, body in (("/v1/couplets", {"upper": "天增岁月人增寿"}),
                           ("/v1/couplets/batch", {"items": [{"upper": "天增岁月人增寿"}]}),
                           ("/v1/jobs", {"items": [{"upper": "天增岁月人增寿"}]})):
            r = await h.client.post(path, json=body)
            assert_error(r, 503, "shutting_down")
            assert r.headers["retry-after"] == "1" and r.headers["x-request-id"]
        assert (await h.client.get("/healthz")).status_code == 200  # alive, only leaving
        assert h.runtime.drain.in_flight == 1
        engine.hold.set()
        answered = await in_flight
        assert answered.status_code == 200 and answered.json()["lower"]
        assert h.runtime.drain.in_flight == 0


async def test_the_server_waits_for_requests_in_flight_then_stops_within_its_limit() -> None:
    drain = Drain()
    called: list[bool] = []
    server = DrainingServer(uvicorn.Config(app=lambda *a: None), drain, lambda: called.append(True), limit_s=5.0)
    drain.in_flight = 1
    task = asyncio.create_task(server.run_drain())
    await asyncio.sleep(0.1)
    assert drain.draining and called == [True] and not server.should_exit
    drain.in_flight = 0
    await asyncio.wait_for(task, 2)
    assert server.should_exit and not server.force_exit
    # bounded: a request that never finishes does not hold the process past the limit
    stuck = DrainingServer(uvicorn.Config(app=lambda *a: None), Drain(), lambda: None, limit_s=0.2)
    stuck.drain.in_flight = 1
    await asyncio.wait_for(stuck.run_drain(), 2)
    assert stuck.should_exit


def test_signals_drain_first_then_stop_waiting_then_force() -> None:
    server = DrainingServer(uvicorn.Config(app=lambda *a: None), Drain(), lambda: None, limit_s=5.0)
    server.handle_exit(15, None)  # before the port opened: nothing to drain, stop
    assert server.should_exit and not server.force_exit
    started = DrainingServer(uvicorn.Config(app=lambda *a: None), Drain(), lambda: None, limit_s=5.0)
    started.started = True
    loop = asyncio.new_event_loop()
    try:
        started._loop = loop
        started.handle_exit(15, None)
        assert not started.should_exit  # draining (scheduled on the loop)
        started.handle_exit(15, None)
        assert started.should_exit and not started.force_exit
        started.handle_exit(2, None)
        assert started.force_exit
        assert started._captured_signals == []  # never re-raised: the process exits 0
    finally:
        loop.close()
