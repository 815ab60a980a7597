"""The HTTP contract, in process, against a fake engine: shapes, caching, errors, headers."""

from __future__ import annotations

import asyncio

import pytest

from chunlian.engine.request import SeqOutput, model_request
from chunlian.engine.rerank import build_result
from chunlian.errors import DeadlineExceeded, EngineStopped, Overloaded
from chunlian.types import CoupletRequest, CoupletResult
from tests.unit.api_fakes import FakeEngine, running_app


def assert_error(resp, status: int, code: str, field: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "field"}
    assert body["error"]["code"] == code
    assert body["error"]["field"] == field
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in resp.text and ".py" not in resp.text
    return body["error"]


async def test_couplet_then_cached_repeat() -> None:
    async with running_app() as h:
        r1 = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        assert r1.status_code == 200, r1.text
        b1 = r1.json()
        assert set(b1) == {"upper", "lower", "hengpi", "style", "cached", "model", "served"}
        assert b1["upper"] == "春回大地千山秀" and len(b1["lower"]) == 7
        assert b1["cached"] is False and b1["model"] == "fake-couplet@test"
        assert b1["style"] == "traditional"
        r2 = await h.client.post("/v1/couplets", json={"upper": " 春回大地千山秀 "})
        b2 = r2.json()
        assert b2["cached"] is True
        assert {k: b2[k] for k in ("upper", "lower", "hengpi")} == {k: b1[k] for k in ("upper", "lower", "hengpi")}
        assert len(h.engine.calls) == 1  # the repeat never reached the engine
        req = h.engine.calls[0]
        assert req.params.greedy and req.priority == "interactive"
        # the default deadline, less the time the request already spent in the service
        assert 0 < req.timeout_s <= h.runtime.settings.default_timeout_ms / 1000


async def test_candidates_only_when_n_above_one_and_timeout_passed_on() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json={"upper": "天增岁月人增寿", "n": 3, "timeout_ms": 2500})
        body = r.json()
        assert r.status_code == 200 and len(body["candidates"]) == 3
        assert body["candidates"][0]["lower"] == body["lower"]
        assert set(body["candidates"][0]) == {"upper", "lower", "hengpi", "style"}
        assert 2.0 < h.engine.calls[0].timeout_s <= 2.5  # less the time already spent
        assert h.engine.calls[0].params.n == 3


async def test_regenerate_uses_fresh_seed_and_keeps_default_cached() -> None:
    async with running_app() as h:
        first = (await h.client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁"})).json()
        regen = (await h.client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁", "regenerate": True})).json()
        assert regen["cached"] is False
        assert h.engine.calls[-1].params.seed is not None  # sampled, not greedy
        again = (await h.client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁"})).json()
        assert again["cached"] is True and again["lower"] == first["lower"]
        assert len(h.engine.calls) == 2


async def test_seeded_requests_are_cached_under_their_seed() -> None:
    async with running_app() as h:
        a = (await h.client.post("/v1/couplets", json={"upper": "生意兴隆通四海", "seed": 7})).json()
        b = (await h.client.post("/v1/couplets", json={"upper": "生意兴隆通四海", "seed": 7})).json()
        c = (await h.client.post("/v1/couplets", json={"upper": "生意兴隆通四海", "seed": 8})).json()
        assert (a["cached"], b["cached"], c["cached"]) == (False, True, False)
        assert a["lower"] == b["lower"] != c["lower"]


async def test_compose_heads_and_keyword() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets/compose", json={"heads": "李明", "length": 5, "style": "family"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["style"] == "family" and len(body["upper"]) == 5 and body["upper"][0] == "李"
        req = h.engine.calls[-2]  # the 上联's search (``engine.composed``), then its 下联
        assert (req.heads, req.length, req.keyword, req.upper) == ("李明", 5, None, None)
        r = await h.client.post("/v1/couplets/compose", json={"keyword": "新春"})
        assert r.status_code == 200
        req = h.engine.calls[-2]
        assert (req.keyword, req.length) == ("新春", 7)
        again = await h.client.post("/v1/couplets/compose", json={"keyword": "新春", "length": 7})
        assert again.json()["cached"] is True


async def test_typed_punctuation_is_folded_and_shares_the_cache_entry() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json={"upper": "山药出格九万斤--真大"})
        assert r.status_code == 200, r.text
        assert r.json()["upper"] == "山药出格九万斤——真大" and r.json()["cached"] is False
        assert h.engine.calls[0].upper == "山药出格九万斤——真大"
        for spelling in ("山药出格九万斤——真大", "山药出格九万斤—真大", "山药出格九万斤 - - 真大"):
            again = await h.client.post("/v1/couplets", json={"upper": spelling})
            assert again.json()["cached"] is True, spelling
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地, 万象更新. 天增岁月...人增寿"})
        assert r.status_code == 200 and r.json()["upper"] == "春回大地，万象更新。天增岁月……人增寿"
        line = "春" * 15 + "——" + "风" * 15  # 32 characters with the dash
        assert (await h.client.post("/v1/couplets", json={"upper": line})).status_code == 200
        assert len(h.engine.calls) == 3


class ModelFormEngine(FakeEngine):
    """The fake answers the line as the model reads it (``model_request``), and the answer
    goes back to what was typed the way the real engine's does (``rerank.build_result``)."""

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        res = await super().generate(model_request(req))
        outs = [SeqOutput(i, c.upper, c.lower, 0.0) for i, c in enumerate(res.candidates or (res.best,))]
        return build_result(req, outs, None, self.model_tag)


async def test_a_closing_mark_is_mirrored_and_cached_apart_from_the_bare_line() -> None:
    async with running_app(ModelFormEngine()) as h:
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地!"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["upper"] == "春回大地！" and body["lower"].endswith("！") and len(body["lower"]) == 5
        assert h.engine.calls[-1].upper == "春回大地"  # the model never sees the mark
        bare = (await h.client.post("/v1/couplets", json={"upper": "春回大地"})).json()
        assert bare["cached"] is False and bare["lower"] == body["lower"][:-1]
        again = (await h.client.post("/v1/couplets", json={"upper": "春回大地！"})).json()
        assert again["cached"] is True and again["lower"] == body["lower"]
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地...", "n": 2, "seed": 5})
        assert r.status_code == 200 and all(c["lower"].endswith("……") for c in r.json()["candidates"])
        bad = assert_error(await h.client.post("/v1/couplets", json={"upper": "春回大地，"}),
                           422, "invalid_input", "upper")
        assert "end with a Chinese character or one of 。！？ ……" in bad["message"]
        assert len(h.engine.calls) == 3


BAD_COUPLETS = [
    ({"upper": ""}, "upper"),
    ({"upper": "   "}, "upper"),
    ({"upper": "hello world"}, "upper"),
    ({"upper": "春回大地abc"}, "upper"),
    ({"upper": "春" * 33}, "upper"),
    ({"upper": "春" * 1100}, "upper"),
    ({"upper": "，春回大地"}, "upper"),
    ({"upper": "春回，，大地"}, "upper"),
    ({"upper": "春回\x00大地"}, "upper"),
    ({"upper": "——"}, "upper"),
    ({"upper": "--春回大地"}, "upper"),
    ({"upper": "春回大地，"}, "upper"),
    ({"upper": "春回大地--"}, "upper"),
    ({"upper": "春回大地!!"}, "upper"),
    ({"upper": "!春回大地"}, "upper"),
    ({"upper": "春回——，大地"}, "upper"),
    ({"upper": "春回----大地"}, "upper"),
    ({"upper": "春回-大地"}, "upper"),
    ({"upper": "春" * 16 + "--" + "风" * 15}, "upper"),
    ({"upper": 123}, "upper"),
    ({"upper": None}, "upper"),
    ({"upper": ["春"]}, "upper"),
    ({}, "upper"),
    ({"upper": "春回大地千山秀", "style": "modern"}, "style"),
    ({"upper": "春回大地千山秀", "style": 1}, "style"),
    ({"upper": "春回大地千山秀", "n": 0}, "n"),
    ({"upper": "春回大地千山秀", "n": 9}, "n"),
    ({"upper": "春回大地千山秀", "n": "3"}, "n"),
    ({"upper": "春回大地千山秀", "n": 1.5}, "n"),
    ({"upper": "春回大地千山秀", "n": True}, "n"),
    ({"upper": "春回大地千山秀", "seed": -1}, "seed"),
    ({"upper": "春回大地千山秀", "seed": "x"}, "seed"),
    ({"upper": "春回大地千山秀", "seed": 2**64}, "seed"),
    ({"upper": "春回大地千山秀", "regenerate": "yes"}, "regenerate"),
    ({"upper": "春回大地千山秀", "timeout_ms": 0}, "timeout_ms"),
    ({"upper": "春回大地千山秀", "timeout_ms": 10**9}, "timeout_ms"),
]


@pytest.mark.parametrize(("body", "field"), BAD_COUPLETS)
async def test_bad_couplet_input_is_422_naming_the_field(body: dict, field: str) -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json=body)
        assert_error(r, 422, "invalid_input", field)
        assert h.engine.calls == []


BAD_COMPOSE = [
    ({}, "heads"),
    ({"heads": "李明", "keyword": "新春"}, "keyword"),
    ({"heads": ""}, "heads"),
    ({"heads": "欧阳小明明"}, "heads"),
    ({"heads": "Li"}, "heads"),
    ({"heads": "李，"}, "heads"),
    ({"keyword": ""}, "keyword"),
    ({"keyword": "恭喜发财啊"}, "keyword"),
    ({"keyword": "ab"}, "keyword"),
    ({"heads": "李明", "length": 6}, "length"),
    ({"heads": "李明", "length": "7"}, "length"),
    ({"heads": "李明", "style": "rap"}, "style"),
    ({"heads": 5}, "heads"),
]


@pytest.mark.parametrize(("body", "field"), BAD_COMPOSE)
async def test_bad_compose_input_is_422_naming_the_field(body: dict, field: str) -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets/compose", json=body)
        assert_error(r, 422, "invalid_input", field)
        assert h.engine.calls == []


@pytest.mark.parametrize(
    ("content", "headers", "code"),
    [
        ('{"upper": "春回'.encode(), {"content-type": "application/json"}, "invalid_json"),
        (b"not json", {"content-type": "application/json"}, "invalid_json"),
        (b"", {"content-type": "application/json"}, "invalid_input"),
        (b"[1, 2]", {"content-type": "application/json"}, "invalid_input"),
        (b'"upper"', {"content-type": "application/json"}, "invalid_input"),
        (b"upper=x", {"content-type": "application/x-www-form-urlencoded"}, "invalid_input"),
        (b"[" * 3000 + b"]" * 3000, {"content-type": "application/json"}, "invalid_json"),
    ],
)
async def test_unparseable_bodies_are_422(content: bytes, headers: dict, code: str) -> None:
    async with running_app(body_limit_bytes=100_000) as h:
        r = await h.client.post("/v1/couplets", content=content, headers=headers)
        assert_error(r, 422, code, None)


async def test_lone_surrogate_is_422_not_500() -> None:
    async with running_app() as h:
        body = b'{"upper": "\\ud800\\u6625\\u56de"}'
        r = await h.client.post("/v1/couplets", content=body, headers={"content-type": "application/json"})
        assert_error(r, 422, "invalid_input", "upper")


async def test_engine_errors_map_to_statuses() -> None:
    engine = FakeEngine()
    engine.fail = {
        "一帆风顺年年好": Overloaded("queue full", retry_after_s=2.3),
        "天增岁月人增寿": Overloaded("queue full", retry_after_s=0.01),
        "春回大地千山秀": DeadlineExceeded("too slow"),
        "爆竹声声辞旧岁": EngineStopped("stopping"),
        "生意兴隆通四海": RuntimeError("boom at /secret/path.py"),
        "新春": RuntimeError("boom in a framework route"),
    }
    async with running_app(engine) as h:
        r = await h.client.post("/v1/couplets", json={"upper": "一帆风顺年年好"})
        assert_error(r, 429, "overloaded")
        assert r.headers["retry-after"] == "3"
        r = await h.client.post("/v1/couplets", json={"upper": "天增岁月人增寿"})
        assert r.headers["retry-after"] == "1"
        assert_error(await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"}), 504, "deadline_exceeded")
        assert_error(await h.client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁"}), 503, "engine_stopped")
        r = await h.client.post("/v1/couplets", json={"upper": "生意兴隆通四海"}, headers={"x-request-id": "boom-1"})
        assert_error(r, 500, "internal")
        assert "secret" not in r.text and "boom" not in r.text
        assert r.headers["x-request-id"] == "boom-1"
        assert r.headers["x-chunlian-instance"] == "unit-1"
        # a bug behind a route the framework serves (not the fast path): the same shape
        r = await h.client.post("/v1/couplets/compose", json={"keyword": "新春"}, headers={"x-request-id": "boom-2"})
        assert_error(r, 500, "internal")
        assert "boom" not in r.text
        assert r.headers["x-request-id"] == "boom-2"


async def test_request_id_echoed_or_generated_on_every_response() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"}, headers={"X-Request-Id": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        assert r.headers["x-chunlian-instance"] == "unit-1"
        for resp in (
            await h.client.get("/healthz"),
            await h.client.get("/nope"),
            await h.client.post("/v1/couplets", json={"upper": ""}),
            await h.client.get("/v1/couplets"),
        ):
            rid = resp.headers["x-request-id"]
            assert len(rid) == 32 and int(rid, 16) >= 0
            assert resp.headers["x-chunlian-instance"] == "unit-1"
        insane = await h.client.get("/healthz", headers={"x-request-id": "x" * 500})
        assert insane.headers["x-request-id"] != "x" * 500
        assert_error(await h.client.get("/nope"), 404, "not_found")
        assert_error(await h.client.get("/v1/couplets"), 405, "method_not_allowed")


async def test_body_over_limit_is_413_by_length_and_by_stream() -> None:
    async with running_app(body_limit_bytes=2048) as h:
        big = {"upper": "春" * 1000}  # ~3 KB of UTF-8
        r = await h.client.post("/v1/couplets", json=big, headers={"x-request-id": "big-1"})
        assert_error(r, 413, "body_too_large")
        assert r.headers["x-request-id"] == "big-1"

        seen: list[int] = []

        async def chunks():
            for _ in range(100):
                seen.append(1)
                yield b" " * 512

        r = await h.client.post("/v1/couplets", content=chunks(), headers={"content-type": "application/json"})
        assert_error(r, 413, "body_too_large")
        assert len(seen) < 100  # refused before the whole body was read
        assert h.engine.calls == []


async def test_headers_over_cap_are_431() -> None:
    async with running_app() as h:
        r = await h.client.get("/healthz", headers={"x-junk": "j" * 20_000})
        assert_error(r, 431, "headers_too_large")


async def test_not_ready_until_warm_then_ready() -> None:
    engine = FakeEngine()
    engine.start_gate = asyncio.Event()
    async with running_app(engine, wait_ready=False) as h:
        assert (await h.client.get("/healthz")).status_code == 200
        r = await h.client.get("/readyz")
        assert_error(r, 503, "not_ready")
        assert r.headers["retry-after"] == "1"
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        assert_error(r, 503, "not_ready")
        metrics = (await h.client.get("/metrics")).text
        assert "chunlian_ready 0.0" in metrics
        engine.start_gate.set()
        await asyncio.wait_for(h.runtime.wait_ready(), 10)
        r = await h.client.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        assert r.json()["model"] == "fake-couplet@test"
        assert (await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})).status_code == 200
        assert "chunlian_ready 1.0" in (await h.client.get("/metrics")).text
    assert engine.stopped


async def test_warmup_runs_before_ready_and_fills_the_cache() -> None:
    engine = FakeEngine()
    async with running_app(engine, warmup="新春,春回大地千山秀") as h:
        # composed in two stages (``engine.composed``): their 上联 searches, then 下联 requests
        kinds = sorted((r.keyword or r.upper or "", r.length or 0) for r in engine.calls if r.upper is None)
        assert kinds == [("新春", 5), ("新春", 7)]
        assert sum(r.upper == "春回大地千山秀" for r in engine.calls) == 1
        # warmed as the page asks: n = 4 (``api.warmup.PAGE_CANDIDATES``)
        r = await h.client.post("/v1/couplets/compose", json={"keyword": "新春", "length": 5, "n": 4})
        assert r.json()["cached"] is True
        r = await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀", "n": 4})
        assert r.json()["cached"] is True
        assert len(engine.calls) == 5  # the warm-up's alone: two composed (two stages each), one 下联


async def test_batch_answers_each_item_on_its_own() -> None:
    engine = FakeEngine()
    engine.fail = {"一帆风顺年年好": Overloaded("queue full", retry_after_s=1.0)}
    async with running_app(engine, body_limit_bytes=100_000) as h:
        items = [
            {"upper": "春回大地千山秀"},
            {"upper": "hello"},
            {"heads": "李明", "length": 5},
            "not an object",
            {"upper": "一帆风顺年年好"},
            {"upper": "天增岁月人增寿", "n": 2},
            {"upper": "春回大地千山秀", "n": 99},
        ]
        r = await h.client.post("/v1/couplets/batch", json={"items": items})
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert len(res) == len(items)
        assert res[0]["lower"] and res[0]["cached"] is False
        assert res[1]["error"]["code"] == "invalid_input" and res[1]["error"]["field"] == "upper"
        assert res[2]["upper"][0] == "李"
        assert res[3]["error"]["code"] == "invalid_input"
        assert res[4]["error"]["code"] == "overloaded"
        assert len(res[5]["candidates"]) == 2
        assert res[6]["error"]["field"] == "n"
        assert all(c.priority == "bulk" for c in engine.calls)
        again = await h.client.post("/v1/couplets/batch", json={"items": [{"upper": "春回大地千山秀"}]})
        assert again.json()["results"][0]["cached"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [({"items": []}, "items"), ({"items": [{"upper": "春"}] * 257}, "items"), ({"items": "x"}, "items"), ({}, "items")],
)
async def test_batch_envelope_errors(body: dict, field: str) -> None:
    async with running_app(body_limit_bytes=100_000) as h:
        assert_error(await h.client.post("/v1/couplets/batch", json=body), 422, "invalid_input", field)


async def test_client_gone_cancels_the_generation() -> None:
    from chunlian.api.errors import ClientGone
    from chunlian.api.routes import unless_disconnected

    engine = FakeEngine()
    engine.started = True
    engine.hold = asyncio.Event()

    class GoneRequest:
        async def receive(self) -> dict:
            await asyncio.sleep(0)
            return {"type": "http.disconnect"}

    from chunlian.types import CoupletRequest

    with pytest.raises(ClientGone):
        await unless_disconnected(GoneRequest(), engine.generate(CoupletRequest(upper="春回大地")))  # type: ignore[arg-type]
    assert engine.cancelled == 1


async def test_docs_openapi_and_campaign_page() -> None:
    async with running_app() as h:
        assert (await h.client.get("/docs")).status_code == 200
        spec = (await h.client.get("/openapi.json")).json()
        assert {"/v1/couplets", "/v1/couplets/compose", "/v1/couplets/batch", "/healthz", "/readyz"} <= set(spec["paths"])
        page = await h.client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert (await h.client.get("/static/app.js")).status_code == 200
        assert_error(await h.client.get("/static/missing.js"), 404, "not_found")


async def test_not_ready_once_the_engine_stops_running() -> None:
    engine = FakeEngine()
    async with running_app(engine) as h:
        assert (await h.client.get("/readyz")).status_code == 200
        engine.running = False  # type: ignore[attr-defined]  # the engine thread died
        assert_error(await h.client.get("/readyz"), 503, "not_ready")
        assert_error(await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"}), 503, "not_ready")
        assert (await h.client.get("/healthz")).status_code == 200


def test_fast_path_takes_only_plain_valid_requests() -> None:
    from chunlian.api.fastpath import plain_body

    ok = plain_body('{"upper": " 春回大地千山秀 ", "style": "family", "seed": 3, "timeout_ms": 500}'.encode())
    assert ok is not None
    req = ok.to_request()
    assert req.upper == "春回大地千山秀" and req.style == "family"
    assert req.params.seed == 3 and req.timeout_s == 0.5
    dashed = plain_body('{"upper": "山药出格九万斤--真大"}'.encode())
    assert dashed is not None and dashed.to_request().upper == "山药出格九万斤——真大"
    # the text rules are the shared handler's (routes.couplet_reply): the fast path takes these
    assert plain_body(b'{"upper": "hello"}') is not None
    # the campaign page's body: 4 candidates (its 换一副 shows them in turn)
    page = plain_body('{"upper": "春回大地", "style": "traditional", "n": 4, "seed": null, "regenerate": false}'.encode())
    assert page is not None and page.to_request().params.n == 4
    for body in ['{"upper": "春回大地", "n": 9}', '{"upper": "春回大地", "regenerate": true}',
                 '{"upper": "春回大地", "n": true}', '{"upper": "春回大地", "seed": -1}',
                 '{"upper": "春回大地", "style": "nope"}', '{"upper": 3}',
                 '{"upper": "春回大地", "timeout_ms": 5}', '{"upper": "春回大地", "extra": 1}',
                 '[1]', 'nope', '[' * 3000 + ']' * 3000]:
        assert plain_body(body.encode()) is None, body  # the router answers these


PARITY_BODIES: list[object] = [
    {"upper": "春回大地千山秀"},  # a miss
    {"upper": " 春回大地千山秀 "},  # the same line again: a hit
    {"upper": "天增岁月人增寿", "seed": 3, "style": "family", "timeout_ms": 5000},
    {"upper": "hello"},  # the text rules: 422 naming the field
    {"upper": "春回大地，"},
    {"upper": "春" * 33},
    {"upper": "一帆风顺年年好"},  # the engine refuses: 429 with Retry-After
    {"upper": "爆竹声声辞旧岁"},  # the engine stopped: 503
    {"upper": "生意兴隆通四海"},  # past its deadline: 504
    {"upper": 3},  # a bad shape: the router's own 422, for both
    {"upper": "春回大地", "extra": 1},  # an unusual field: the router, for both
    {"upper": "春回大地千山秀", "n": 4},  # the campaign page's n: the fast path too
    {"upper": "春回大地千山秀", "n": True},  # not plain: the router, for both
]
ROUTER_ONLY = {9, 10, 12}  # the indexes the fast path hands on


def _engine_failing() -> FakeEngine:
    engine = FakeEngine()
    engine.fail = {"一帆风顺年年好": Overloaded("queue full", retry_after_s=2.3),
                   "爆竹声声辞旧岁": EngineStopped("stopping"),
                   "生意兴隆通四海": DeadlineExceeded("too slow")}
    return engine


async def test_the_fast_path_and_the_router_answer_alike() -> None:
    """The same bodies, one by one, through the fast path and through the router alone (two
    apps with equal engines): the same status, body and headers, bad input included."""
    import httpx

    from chunlian.api.fastpath import PlainCoupletFastPath

    handed_on: list[int] = []
    seen: list[tuple[int, object]] = []  # (status, cached) of each answer

    async with running_app(_engine_failing()) as fast, running_app(_engine_failing()) as routed:
        framework = fast.app.framework

        async def counting(scope, receive, send):  # type: ignore[no-untyped-def]
            handed_on.append(1)
            await framework(scope, receive, send)

        paths = {"fast": PlainCoupletFastPath(counting, fast.runtime), "router": routed.app.framework}
        clients = {name: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://unit")
                   for name, app in paths.items()}
        try:
            for i, body in enumerate(PARITY_BODIES):
                before = len(handed_on)
                got = {name: await c.post("/v1/couplets", json=body) for name, c in clients.items()}
                a, b = got["fast"], got["router"]
                assert (a.status_code, a.json()) == (b.status_code, b.json()), body
                for header in ("content-type", "retry-after"):
                    assert a.headers.get(header) == b.headers.get(header), (body, header)
                assert len(handed_on) - before == (1 if i in ROUTER_ONLY else 0), body
                seen.append((a.status_code, a.json().get("cached")))
        finally:
            for c in clients.values():
                await c.aclose()
        assert [r.identity() for r in fast.engine.calls] == [r.identity() for r in routed.engine.calls]
    assert seen[:2] == [(200, False), (200, True)]  # a miss, then a hit
    assert {status for status, _ in seen} == {200, 422, 429, 503, 504}


async def test_deadline_counts_from_arrival_before_and_after_the_engine() -> None:
    import time

    from chunlian.api.service import CoupletService
    from chunlian.cache import MemoryStore, ResultCache
    from chunlian.types import CoupletRequest

    engine = FakeEngine()
    engine.started = True
    svc = CoupletService(engine, ResultCache([MemoryStore(16)], ttl_s=60), default_timeout_s=0.5)
    # the budget was spent before the engine (say, in the server's queue): never generated
    with pytest.raises(DeadlineExceeded, match="before generation"):
        await svc.generate(CoupletRequest(upper="春回大地"), arrival_s=time.perf_counter() - 0.6)
    assert engine.calls == []
    # the engine got what was left of the request's own timeout
    await svc.generate(CoupletRequest(upper="春回大地", timeout_s=2.0), arrival_s=time.perf_counter() - 0.5)
    assert 1.0 < engine.calls[-1].timeout_s <= 1.5


async def test_the_deadline_answers_504_at_once_and_the_late_answer_is_cached() -> None:
    engine = FakeEngine()
    engine.hold = asyncio.Event()
    async with running_app(engine) as h:
        late = asyncio.create_task(h.client.post("/v1/couplets", json={"upper": "春回大地", "timeout_ms": 50}))
        # answered at the deadline although the (fake) engine is still generating
        assert_error(await asyncio.wait_for(late, 5), 504, "deadline_exceeded")
        assert not engine.hold.is_set() and engine.cancelled == 0
        engine.hold.set()  # the generation finishes after its caller left, and is cached
        for _ in range(200):
            if engine.stats.completed:
                break
            await asyncio.sleep(0.01)
        again = await h.client.post("/v1/couplets", json={"upper": "春回大地"})
        assert again.status_code == 200 and again.json()["cached"] is True
        assert len(engine.calls) == 1


async def test_an_answer_cached_under_one_zodiac_year_is_no_hit_under_another() -> None:
    from chunlian.api.service import CoupletService
    from chunlian.cache import MemoryStore, ResultCache
    from chunlian.types import CoupletRequest

    engine = FakeEngine()
    engine.started = True
    shared = ResultCache([MemoryStore(16)], ttl_s=60)  # as a Redis shared by two configurations
    req = CoupletRequest(upper="春回大地")
    y2027 = CoupletService(engine, shared, rules_tag="zodiac=2027")
    await y2027.generate(req)
    assert await y2027.cached(req) is not None
    assert await CoupletService(engine, shared, rules_tag="zodiac=2028").cached(req) is None
    assert await CoupletService(engine, shared).cached(req) is None  # the rule off
