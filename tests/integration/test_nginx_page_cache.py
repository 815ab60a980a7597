"""The campaign page through a real nginx in front of a real instance: kept by nginx for
``page_cache_s`` (the instance sees one request per file), compressed, cacheable by browsers,
and still served from the stale copy when no instance answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunlian.config import load_settings
from tests.integration.live_server import LiveServer, model_path, nginx_front, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PAGE_FILES = ("/", "/static/app.js", "/static/style.css", "/static/favicon.svg")


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    weights = model_path(tmp_path_factory.mktemp("model"))
    settings = load_settings(model_path=weights, device="cpu", torch_threads=1, warmup=(), instance_id="page-test")
    with serving(settings) as server:
        yield server


def _instance_page_requests(instance: LiveServer) -> float:
    """Requests for the page's files the instance answered (its own /metrics)."""
    text = httpx.get(f"{instance.base_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("chunlian_http_requests_total{") and ('endpoint="/"' in line or 'endpoint="/static"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_page_is_cached_compressed_and_reaches_the_instance_once_per_file(
        instance: LiveServer, tmp_path: Path) -> None:
    with nginx_front(tmp_path, [instance.port], page_cache_s=60) as front, \
            httpx.Client(base_url=front.url, timeout=30) as c:
        before = _instance_page_requests(instance)
        for round_ in range(5):
            for path in PAGE_FILES:
                r = c.get(path, headers={"Accept-Encoding": "gzip"})
                assert r.status_code == 200, (path, r.status_code)
                assert r.headers["x-cache"] == ("MISS" if round_ == 0 else "HIT"), (path, round_)
                assert r.headers["x-request-id"] and r.headers["cache-control"] == "max-age=60"
                if path in ("/", "/static/app.js", "/static/style.css"):
                    assert r.headers.get("content-encoding") == "gzip", path
        assert _instance_page_requests(instance) - before == len(PAGE_FILES)  # 20 loads, 4 reached it
        assert "春联" in c.get("/").text  # httpx undid the compression: the real page
        # the API is never cached
        first = c.post("/v1/couplets", json={"upper": "春回大地千山秀", "regenerate": True})
        assert first.status_code == 200 and "x-cache" not in first.headers


def test_off_every_load_reaches_the_instance(instance: LiveServer, tmp_path: Path) -> None:
    with nginx_front(tmp_path, [instance.port], page_cache_s=0) as front, \
            httpx.Client(base_url=front.url, timeout=30) as c:
        before = _instance_page_requests(instance)
        for _ in range(3):
            for path in PAGE_FILES:
                r = c.get(path)
                assert r.status_code == 200 and "cache-control" not in r.headers
        assert _instance_page_requests(instance) - before == 3 * len(PAGE_FILES)


def test_the_page_still_loads_from_the_stale_copy_when_no_instance_answers(tmp_path: Path) -> None:
    import time

    settings = load_settings(model_path=model_path(tmp_path / "model"), device="cpu", torch_threads=1,
                             warmup=(), instance_id="page-stale-test")
    with serving(settings) as server, nginx_front(tmp_path, [server.port], page_cache_s=1) as front:
        with httpx.Client(base_url=front.url, timeout=30) as c:
            assert c.get("/").headers["x-cache"] == "MISS"
        server.stop()  # the only instance is gone
        time.sleep(1.5)  # and the copy is past its 1 s
        with httpx.Client(base_url=front.url, timeout=30) as c:
            r = c.get("/")
            assert r.status_code == 200 and r.headers["x-cache"] == "STALE" and "春联" in r.text
            api = c.post("/v1/couplets", json={"upper": "春回大地千山秀"})
            assert api.status_code == 503 and api.json()["error"]["code"] == "unavailable"
