"""The per-client rate limit, enforced by a real nginx in front of a real instance.

nginx runs the config ``chunlian.cluster.nginx`` renders (``--client-rate``), over loopback,
in front of one uvicorn instance with the shipped weights. Each test starts its own nginx
(its own limit state). Bounds, not clocks: a limited run of quick requests must see a 429
in the service's error shape, and no more successes than the rate and burst allow over the
time the run actually took (however slow this machine is that day).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunlian.config import load_settings
from tests.integration.live_server import (
    Front,
    LiveServer,
    exporter_running,
    model_path,
    nginx_front,
    serving,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UPPER = "春回大地千山秀"  # warmed up: every answer is a cache hit, so the instance is never the limit
RATE_PER_S = 0.5  # a refill every 2 s: a slow, busy machine still sends 12 requests faster
BURST = 2


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    weights = model_path(tmp_path_factory.mktemp("model"))
    settings = load_settings(model_path=weights, device="cpu", torch_threads=1, warmup=(UPPER,),
                             instance_id="rate-limit-test")
    with serving(settings) as server:
        yield server


@pytest.fixture
def front(instance: LiveServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Front]:
    """nginx with ``NginxConfig(**request.param)`` in front of the instance."""
    with nginx_front(tmp_path, [instance.port], **request.param) as f:
        yield f


def _burst(client: httpx.Client, count: int, **headers: str) -> tuple[list[httpx.Response], float]:
    """``count`` couplet requests one after another; the responses and the seconds they took."""
    t0 = time.monotonic()
    out = [client.post("/v1/couplets", json={"upper": UPPER}, headers=headers) for _ in range(count)]
    return out, time.monotonic() - t0


def _allowed(elapsed_s: float) -> int:
    """The most requests nginx may let through in ``elapsed_s``: the burst, the first one,
    and one per 1/rate seconds (plus one for a refill landing just inside the window)."""
    return BURST + 1 + math.ceil(elapsed_s * RATE_PER_S) + 1


LIMITED = {"client_rate_per_s": RATE_PER_S, "client_burst": BURST}


@pytest.mark.parametrize("front", [LIMITED], indirect=True)
def test_a_client_over_its_rate_gets_429_in_the_service_shape_and_room_again_later(front: Front) -> None:
    with httpx.Client(base_url=front.url, timeout=30) as c:
        # X-Forwarded-For is not believed without trusted proxies: varying it changes nothing
        responses, elapsed_s = _burst(c, 12, **{"X-Forwarded-For": "198.51.100.9", "X-Request-Id": "rl-1"})
        ok = [r for r in responses if r.status_code == 200]
        limited = [r for r in responses if r.status_code == 429]
        assert len(ok) + len(limited) == len(responses), [r.status_code for r in responses]
        assert BURST + 1 <= len(ok) <= _allowed(elapsed_s), (len(ok), elapsed_s)
        assert limited, "12 quick requests at 30 requests/min with a burst of 2 were never limited"
        r = limited[0]
        assert r.json() == {"error": {"code": "rate_limited", "field": None,
                                      "message": "more than 30 requests/min (burst 2) from this address; retry in 2 s"}}
        assert r.headers["Retry-After"] == "2" and r.headers["X-Request-Id"] == "rl-1"
        assert "X-Chunlian-Instance" not in r.headers  # nginx's answer: no instance saw it
        assert all(r.headers.get("X-Chunlian-Instance") == "rate-limit-test" for r in ok)
        # only /v1/couplets and /v1/jobs are limited: health and the page are not
        assert all(c.get("/healthz").status_code == 200 for _ in range(10))
        assert c.get("/nginx-health").status_code == 200
        time.sleep(1.0 / RATE_PER_S + 0.5)  # one request's worth of room comes back
        assert c.post("/v1/couplets", json={"upper": UPPER}).status_code == 200
    states = front.limit_states(at_least=len(responses) + 1)  # the access log tells operators which requests were refused
    assert states.count("REJECTED") == len(limited) and states.count("PASSED") == len(ok) + 1


@pytest.mark.parametrize("front", [{**LIMITED, "rate_limit_dry_run": True}], indirect=True)
def test_a_dry_run_refuses_nothing_and_logs_what_it_would_refuse(front: Front) -> None:
    with httpx.Client(base_url=front.url, timeout=30) as c:
        responses, elapsed_s = _burst(c, 12)
    assert [r.status_code for r in responses] == [200] * 12
    states = front.limit_states(at_least=12)
    assert len(states) == 12 and states.count("REJECTED_DRY_RUN") >= 12 - _allowed(elapsed_s), states
    assert states.count("REJECTED_DRY_RUN") >= 1 and set(states) <= {"PASSED", "REJECTED_DRY_RUN"}


@pytest.mark.parametrize("front", [{**LIMITED, "cors_origins": ("https://fu.example.com",)}], indirect=True)
def test_a_cross_origin_page_can_read_the_refusal(front: Front) -> None:
    """nginx's own 429 carries the CORS headers for an allowed page (CHUNLIAN_CORS_ORIGINS),
    so the page can show its 'retry in N s' message; another site's gets none."""
    with httpx.Client(base_url=front.url, timeout=30) as c:
        responses, _ = _burst(c, 12, Origin="https://fu.example.com")
        refused = [r for r in responses if r.status_code == 429]
        assert refused and refused[0].headers["Access-Control-Allow-Origin"] == "https://fu.example.com"
        assert "Retry-After" in refused[0].headers["Access-Control-Expose-Headers"]
        other = c.post("/v1/couplets", json={"upper": UPPER}, headers={"Origin": "https://evil.example"})
        assert other.status_code == 429 and "Access-Control-Allow-Origin" not in other.headers


@pytest.mark.parametrize("front", [{**LIMITED, "rate_limit_exempt": ("127.0.0.0/8",)}], indirect=True)
def test_an_exempt_address_is_never_limited(front: Front) -> None:
    with httpx.Client(base_url=front.url, timeout=30) as c:
        responses, _ = _burst(c, 12)
    assert [r.status_code for r in responses] == [200] * 12


@pytest.mark.parametrize("front", [{**LIMITED, "trusted_proxies": ("127.0.0.1",)}], indirect=True)
def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_budget(front: Front) -> None:
    with httpx.Client(base_url=front.url, timeout=30) as c:
        first, elapsed_s = _burst(c, 12, **{"X-Forwarded-For": "203.0.113.7"})
        codes = [r.status_code for r in first]
        assert 429 in codes and codes.count(200) <= _allowed(elapsed_s), codes
        # another client behind the same proxy is not held back by the first one's use
        other, _ = _burst(c, BURST + 1, **{"X-Forwarded-For": "203.0.113.8"})
        assert [r.status_code for r in other] == [200] * (BURST + 1)


@pytest.mark.parametrize("front", [LIMITED], indirect=True)
async def test_warmup_behind_the_limit_waits_out_its_refusals_and_ends_warm(front: Front) -> None:
    from chunlian.api.warmup import warmup_remote

    # 800 items are four batches, one request each: the fourth is over the burst and refused
    # (429, Retry-After 2) until the rate lets it through
    report = await warmup_remote(front.url, [UPPER] * 800, timeout_s=60)
    assert (report.requested, report.ok, report.failed) == (800, 800, 0), report.errors
    deadline = time.monotonic() + 10  # nginx writes a request's log line just after its answer
    while (states := front.limit_states()).count("PASSED") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert states.count("PASSED") == 4 and states.count("REJECTED") >= 1, states


@pytest.mark.parametrize("front", [LIMITED], indirect=True)
def test_the_exporter_counts_what_the_limit_refused(front: Front) -> None:
    with exporter_running(front) as metrics:
        with httpx.Client(base_url=front.url, timeout=30) as c:
            responses, _ = _burst(c, 12)
        refused = sum(r.status_code == 429 for r in responses)
        assert refused, [r.status_code for r in responses]
        want = [f'chunlian_nginx_limit_req_total{{state="REJECTED"}} {float(refused)}',
                f'chunlian_nginx_responses_total{{code="429"}} {float(refused)}',
                f'chunlian_nginx_limit_req_total{{state="PASSED"}} {float(12 - refused)}',
                "chunlian_nginx_up 1.0"]
        deadline = time.monotonic() + 15
        while not all(w in (text := httpx.get(metrics, timeout=10).text) for w in want):
            assert time.monotonic() < deadline, (want, text)
            time.sleep(0.1)
