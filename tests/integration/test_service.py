"""The HTTP contract through real HTTP: uvicorn on a free loopback port, the real engine.

Readiness is observed deterministically: the engine's start is held on a gate until the
fixture has seen ``/readyz`` answer 503.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine
from chunlian.names import banned_after_head
from chunlian.text import is_han
from tests.integration.live_server import LiveServer, free_socket, model_path
from tests.unit.test_api_metrics import sample
from tests.unit.test_api_routes import BAD_COMPOSE, BAD_COUPLETS, assert_error

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

INSTANCE = "itest-service-1"


class GatedEngine(Engine):
    """The real engine whose start waits for the test to open ``gate``."""

    gate = threading.Event()

    async def start(self) -> None:
        await asyncio.to_thread(self.gate.wait, 120)
        await super().start()


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_path(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def live(weights: Path) -> Iterator[tuple[LiveServer, dict[str, httpx.Response]]]:
    settings = load_settings(
        model_path=weights, device="cpu", max_batch_size=16, instance_id=INSTANCE,
        body_limit_bytes=8192, warmup=("新春", "春回大地千山秀"), torch_threads=1,
    )
    GatedEngine.gate.clear()
    server = LiveServer(settings, GatedEngine.from_config(EngineConfig.from_settings(settings))).start()
    try:
        before: dict[str, httpx.Response] = {}
        with httpx.Client(base_url=server.base_url, timeout=10) as c:
            before["healthz"] = c.get("/healthz")
            before["readyz"] = c.get("/readyz")
            before["couplet"] = c.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        GatedEngine.gate.set()
        server.wait_ready()
        yield server, before
    finally:
        GatedEngine.gate.set()
        server.stop()


@pytest.fixture
def client(live: tuple[LiveServer, dict[str, httpx.Response]]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live[0].base_url, timeout=30) as c:
        yield c


def check_couplet(body: dict, upper: str | None = None, shared: str = "") -> None:
    """``shared``: the one character both lines may hold (a name's repeated character)."""
    assert {"upper", "lower", "hengpi", "style", "cached", "model"} <= set(body)
    if upper is not None:
        assert body["upper"] == upper
    assert len(body["lower"]) == len(body["upper"])
    assert all(is_han(ch) for ch in body["lower"])
    assert set(body["upper"]) & set(body["lower"]) <= set(shared)  # no 上联 character reused
    assert body["hengpi"] and all(is_han(ch) for ch in body["hengpi"])
    assert re.fullmatch(r"chunlian-couplet@\S+", body["model"])


def test_readyz_503_before_ready_then_200(live: tuple[LiveServer, dict[str, httpx.Response]], client: httpx.Client) -> None:
    _, before = live
    assert before["healthz"].status_code == 200
    assert_error(before["readyz"], 503, "not_ready")
    assert_error(before["couplet"], 503, "not_ready")
    assert before["couplet"].headers["retry-after"] == "1"
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    assert r.json()["model"].startswith("chunlian-couplet@")
    assert client.get("/healthz").json() == {"status": "ok", "instance": INSTANCE, "model": r.json()["model"]}


def test_couplet_contract_and_cache(client: httpx.Client) -> None:
    r = client.post("/v1/couplets", json={"upper": "天增岁月人增寿"})
    assert r.status_code == 200, r.text
    first = r.json()
    check_couplet(first, "天增岁月人增寿")
    assert first["cached"] is False and "candidates" not in first
    again = client.post("/v1/couplets", json={"upper": "天增岁月人增寿"}).json()
    assert again["cached"] is True and again["lower"] == first["lower"]


def test_a_typed_dash_is_mirrored_in_the_lower_line(client: httpx.Client) -> None:
    r = client.post("/v1/couplets", json={"upper": "山药出格九万斤--真大"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["upper"] == "山药出格九万斤——真大"
    lower = body["lower"]
    assert len(lower) == 11 and lower[7:9] == "——"
    assert all(is_han(ch) for ch in lower[:7] + lower[9:])
    assert not set(body["upper"][:7] + body["upper"][9:]) & set(lower)
    r = client.post("/v1/couplets", json={"upper": "爆竹聲聲辭舊歲...梅花香"})
    assert r.status_code == 200, r.text
    assert r.json()["upper"] == "爆竹聲聲辭舊歲……梅花香" and r.json()["lower"][7:9] == "……"


def test_warmup_entries_are_cached_before_ready(client: httpx.Client) -> None:
    # warmed as the campaign page asks: n = 4 (``api.warmup.PAGE_CANDIDATES``)
    assert client.post("/v1/couplets", json={"upper": "春回大地千山秀", "n": 4}).json()["cached"] is True
    for length in (5, 7):
        body = client.post("/v1/couplets/compose", json={"keyword": "新春", "length": length, "n": 4}).json()
        assert body["cached"] is True and body["upper"].startswith("新春") and len(body["upper"]) == length


def test_candidates_seed_and_regenerate(client: httpx.Client) -> None:
    body = client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁", "n": 3, "style": "business"}).json()
    assert len(body["candidates"]) == 3 and body["style"] == "business"
    for c in body["candidates"]:
        check_couplet({**c, "cached": False, "model": body["model"]}, "爆竹声声辞旧岁")
    a = client.post("/v1/couplets", json={"upper": "一帆风顺年年好", "seed": 42}).json()
    b = client.post("/v1/couplets", json={"upper": "一帆风顺年年好", "seed": 42}).json()
    assert a["lower"] == b["lower"] and (a["cached"], b["cached"]) == (False, True)
    default = client.post("/v1/couplets", json={"upper": "生意兴隆通四海"}).json()
    regen = client.post("/v1/couplets", json={"upper": "生意兴隆通四海", "regenerate": True}).json()
    assert regen["cached"] is False
    check_couplet(regen, "生意兴隆通四海")
    after = client.post("/v1/couplets", json={"upper": "生意兴隆通四海"}).json()
    assert after["cached"] is True and after["lower"] == default["lower"]


def test_a_traditional_upper_is_answered_in_traditional_and_cached_apart(client: httpx.Client) -> None:
    from chunlian.script import is_traditional, traditional

    trad = client.post("/v1/couplets", json={"upper": "爆竹聲聲辭舊歲"}).json()
    check_couplet(trad, "爆竹聲聲辭舊歲")
    assert trad["cached"] is False
    simp = client.post("/v1/couplets", json={"upper": "爆竹声声辞旧岁"}).json()
    assert simp["cached"] is False and not is_traditional(simp["lower"] + simp["hengpi"])
    # the same couplet, converted (a line may hold no character that conversion changes)
    assert (trad["lower"], trad["hengpi"]) == (traditional(simp["lower"]), traditional(simp["hengpi"]))
    assert is_traditional(trad["lower"] + trad["hengpi"])
    assert client.post("/v1/couplets", json={"upper": "爆竹聲聲辭舊歲"}).json()["lower"] == trad["lower"]


def test_compose_heads_and_keyword(client: httpx.Client) -> None:
    body = client.post("/v1/couplets/compose", json={"heads": "李明", "length": 5}).json()
    check_couplet(body)
    assert body["upper"][0] == "李" and body["lower"][0] == "明" and len(body["upper"]) == 5
    body = client.post("/v1/couplets/compose", json={"keyword": "平安", "length": 7, "style": "family"}).json()
    check_couplet(body)
    assert body["upper"].startswith("平安") and body["style"] == "family"


@pytest.mark.parametrize(("name", "heads"), [("王秀英", "秀英"), ("李丹丹", "丹丹"), ("晶晶", "晶晶"), ("胡军", "胡军")])
def test_compose_names_in_each_quality_on_the_real_engine(client: httpx.Client, name: str, heads: str) -> None:
    answers = {}
    for q in ("fast", "best"):
        body = client.post("/v1/couplets/compose", json={"heads": name, "quality": q}).json()
        check_couplet(body, shared=heads[0] if heads[0] == heads[1] else "")
        assert body["served"] == q and not body["cached"], body
        assert body["upper"][0] == heads[0] and body["lower"][0] == heads[1], body
        shared = set(body["upper"]) & set(body["lower"])
        assert shared == ({heads[0]} if heads[0] == heads[1] else set()), body
        assert body["upper"][1] not in banned_after_head(heads[0]) and body["lower"][1] not in banned_after_head(heads[1])
        answers[q] = body
    again = client.post("/v1/couplets/compose", json={"heads": name, "quality": "auto"}).json()
    assert again["cached"] and again["served"] == "best" and again["lower"] == answers["best"]["lower"]
    several = client.post("/v1/couplets/compose", json={"heads": name, "quality": "best", "n": 4}).json()
    pairs = [(c["upper"], c["lower"]) for c in several["candidates"]]
    assert several["served"] == "best" and len(pairs) == len(set(pairs)) >= 2, several
    assert all(u[0] == heads[0] and lo[0] == heads[1] for u, lo in pairs)


def test_compose_refuses_a_vulgar_name_naming_the_field(client: httpx.Client) -> None:
    for q in ("best", "fast"):
        assert_error(client.post("/v1/couplets/compose", json={"heads": "王傻逼", "quality": q}),
                     422, "invalid_input", "heads")


def test_batch_mixed_items(client: httpx.Client) -> None:
    items = [{"upper": "梅花点点迎新春"}, {"upper": "abc"}, {"heads": "王芳"}, 7, {"upper": "春回大地千山秀", "n": 2}]
    r = client.post("/v1/couplets/batch", json={"items": items})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    check_couplet(res[0], "梅花点点迎新春")
    assert res[1]["error"]["code"] == "invalid_input" and res[1]["error"]["field"] == "upper"
    assert res[2]["upper"][0] == "王" and res[2]["lower"][0] == "芳"
    assert res[3]["error"]["code"] == "invalid_input"
    assert len(res[4]["candidates"]) == 2
    assert_error(client.post("/v1/couplets/batch", json={"items": [{"upper": "春"}] * 257}), 422, "invalid_input", "items")


@pytest.mark.parametrize(("body", "field"), BAD_COUPLETS)
def test_every_bad_couplet_input(client: httpx.Client, body: dict, field: str) -> None:
    assert_error(client.post("/v1/couplets", json=body), 422, "invalid_input", field)


@pytest.mark.parametrize(("body", "field"), BAD_COMPOSE)
def test_every_bad_compose_input(client: httpx.Client, body: dict, field: str) -> None:
    assert_error(client.post("/v1/couplets/compose", json=body), 422, "invalid_input", field)


def test_bad_json_sizes_and_methods(client: httpx.Client) -> None:
    json_ct = {"content-type": "application/json"}
    assert_error(client.post("/v1/couplets", content=b'{"upper": ', headers=json_ct), 422, "invalid_json")
    assert_error(client.post("/v1/couplets", content=b"\xff\xfe", headers=json_ct), 422, "invalid_json")
    assert_error(client.post("/v1/couplets", content=b"", headers=json_ct), 422, "invalid_input")
    assert_error(client.post("/v1/couplets", content=b"[" * 3000, headers=json_ct), 422, "invalid_json")
    assert_error(client.post("/v1/couplets", json={"upper": "春" * 3000}), 413, "body_too_large")

    def stream() -> Iterator[bytes]:
        for _ in range(64):
            yield b" " * 1024

    r = client.post("/v1/couplets", content=stream(), headers=json_ct)  # chunked, no length
    assert_error(r, 413, "body_too_large")
    assert_error(client.get("/healthz", headers={"x-big": "b" * 20_000}), 431, "headers_too_large")
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.delete("/v1/couplets"), 405, "method_not_allowed")


def test_request_id_and_instance_headers(client: httpx.Client) -> None:
    r = client.post("/v1/couplets", json={"upper": "春回大地千山秀"}, headers={"X-Request-Id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"
    assert r.headers["x-chunlian-instance"] == INSTANCE
    for resp in (client.get("/healthz"), client.post("/v1/couplets", json={"upper": ""}), client.get("/metrics")):
        assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["x-request-id"])
        assert resp.headers["x-chunlian-instance"] == INSTANCE


def test_metrics_names(client: httpx.Client) -> None:
    client.post("/v1/couplets", json={"upper": "万事如意步步高"})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "chunlian_http_requests_total", "chunlian_http_request_duration_seconds_bucket",
        "chunlian_cache_requests_total", "chunlian_queue_depth", "chunlian_queue_capacity",
        "chunlian_engine_batch_size_bucket", "chunlian_engine_step_seconds_bucket",
        "chunlian_generated_tokens_total", "chunlian_deadline_drops_total",
        "chunlian_overload_rejections_total", "chunlian_coalesced_requests_total",
        "chunlian_cancelled_requests_total", "chunlian_ready",
    ):
        assert re.search(rf"^{name}[{{ ]", text, re.M), name
    assert sample(text, "chunlian_http_requests_total", endpoint="/v1/couplets", status="200") >= 1
    assert re.search(r"^chunlian_generated_tokens_total [1-9]", text, re.M)
    assert re.search(r"^chunlian_engine_step_seconds_count [1-9]", text, re.M)
    assert "chunlian_ready 1.0" in text


def test_docs_and_campaign_page(client: httpx.Client) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/couplets", "/v1/couplets/compose", "/v1/couplets/batch"} <= set(paths)
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text
    assert client.get("/static/app.js").status_code == 200


def _python_m_api(env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "CHUNLIAN_TORCH_THREADS": "1", "CHUNLIAN_DEVICE": "cpu", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "chunlian.api"], env=full, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_python_m_chunlian_api_serves_and_stops_gracefully(weights: Path) -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = _python_m_api({
        "CHUNLIAN_PORT": str(port), "CHUNLIAN_MODEL_PATH": str(weights), "CHUNLIAN_WARMUP": "新春",
        "CHUNLIAN_MAX_BATCH_SIZE": "8", "CHUNLIAN_INSTANCE_ID": "subproc-1",
    })
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                if httpx.get(base + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.2)
        r = httpx.post(base + "/v1/couplets", json={"upper": "春回大地千山秀"}, headers={"x-request-id": "sub-rid-7"}, timeout=30)
        assert r.status_code == 200 and r.headers["x-chunlian-instance"] == "subproc-1"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.returncode in (0, -signal.SIGTERM), err[-2000:]
        assert "Application shutdown complete" in err
        assert "warm-up done: 2 of 2" in err
        assert "rid=sub-rid-7" in err  # the access log line carries the request id
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_python_m_chunlian_api_fails_loudly_on_bad_setup(tmp_path: Path) -> None:
    proc = _python_m_api({"CHUNLIAN_PORT": "not-a-port"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "CHUNLIAN_PORT" in err
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = _python_m_api({"CHUNLIAN_PORT": str(port), "CHUNLIAN_MODEL_PATH": str(tmp_path / "missing.safetensors")})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "model weights not found" in err
