"""/metrics: every documented family is exported and moves with the traffic."""

from __future__ import annotations

import re

from chunlian.api.metrics import ServiceMetrics
from chunlian.bench.promtext import parse_metrics
from tests.unit.api_fakes import running_app

EXPECTED = [
    "chunlian_http_requests_total", "chunlian_http_request_duration_seconds_bucket",
    "chunlian_cache_requests_total", "chunlian_queue_depth", "chunlian_queue_capacity",
    "chunlian_engine_batch_size_bucket", "chunlian_engine_step_seconds_bucket",
    "chunlian_generated_tokens_total", "chunlian_deadline_drops_total",
    "chunlian_overload_rejections_total", "chunlian_coalesced_requests_total",
    "chunlian_cancelled_requests_total", "chunlian_ready",
]


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly these labels (0 when absent)."""
    return sum(v for got, v in parse_metrics(text).get(name, ()) if got == labels)


async def test_metrics_names_and_values() -> None:
    async with running_app(max_queue_size=77) as h:
        await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        await h.client.post("/v1/couplets", json={"upper": "春回大地千山秀"})
        await h.client.post("/v1/couplets", json={"upper": "abc"})
        r = await h.client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        text = r.text
        for name in EXPECTED:
            assert name in text, name
        assert "chunlian_redis_up" not in text  # no Redis configured
        assert "chunlian_gpu_memory_bytes" not in text  # cpu
        assert sample(text, "chunlian_http_requests_total", endpoint="/v1/couplets", status="200") == 2
        assert sample(text, "chunlian_http_requests_total", endpoint="/v1/couplets", status="422") == 1
        assert sample(text, "chunlian_http_request_duration_seconds_count", endpoint="/v1/couplets") == 3
        assert sample(text, "chunlian_cache_requests_total", store="memory", result="hit") == 1
        assert sample(text, "chunlian_cache_requests_total", store="memory", result="miss") == 1
        assert sample(text, "chunlian_cache_requests_total", store="memory", result="error") == 0
        assert sample(text, "chunlian_queue_capacity") == 8  # read from engine.stats at scrape time
        assert sample(text, "chunlian_generated_tokens_total") == 7
        assert sample(text, "chunlian_engine_batch_size_count") == 1
        assert sample(text, "chunlian_engine_step_seconds_count") == 1
        assert sample(text, "chunlian_ready") == 1
        assert re.search(r"^chunlian_http_requests_total\{endpoint=\"unmatched\"", text, re.M) is None
        await h.client.get("/no/such/path")
        text = (await h.client.get("/metrics")).text
        assert sample(text, "chunlian_http_requests_total", endpoint="unmatched", status="404") == 1


def test_redis_gauge_follows_state_changes() -> None:
    m = ServiceMetrics(queue_capacity=4, redis_configured=True)
    assert b"chunlian_redis_up 1.0" in m.render()
    m.on_redis_state(False)
    assert b"chunlian_redis_up 0.0" in m.render()
    m.on_redis_state(True)
    assert b"chunlian_redis_up 1.0" in m.render()


def test_registries_are_per_instance() -> None:
    a = ServiceMetrics(queue_capacity=4, redis_configured=False)
    b = ServiceMetrics(queue_capacity=4, redis_configured=False)
    a.observe_request("/x", 200, 0.01)
    assert b'endpoint="/x"' in a.render() and b'endpoint="/x"' not in b.render()
