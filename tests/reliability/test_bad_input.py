"""Scenario 6, bad input: fixed hostile requests, hypothesis over the text fields and
schemathesis over ``/openapi.json``, all against the real service: zero 5xx (504 only for a
deadline the request set itself), every refusal a 4xx in the error shape, nothing internal
in any body. The counts are bounded here; the long run sends more (``-m slow``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.reliability import harness as rel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

KEY = rel.API_KEYS[0]


async def test_fixed_hostile_requests(main_service: rel.ServiceProcess) -> None:
    out = await rel.fixed_cases(main_service.url, KEY)
    assert out.ok, out.summary()
    assert out.sent == len(rel.hostile_cases()) and out.failed == 0
    assert out.statuses["413"] >= 3  # the 10 MB bodies, with and without a length


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(req=rel.hostile_request_strategy())
def test_hypothesis_text_fields(main_service: rel.ServiceProcess, req: tuple[str, Any, str, str | None]) -> None:
    path, obj, encoding, ctype = req
    data = rel.encode_body(obj, encoding)
    headers = {"X-API-Key": KEY, **({"Content-Type": ctype} if ctype else {})}
    r = httpx.post(main_service.url + path, content=data, headers=headers, timeout=120)
    out = rel.Outcome("hypothesis")
    rel.check_hostile_reply(out, r.status_code, r.headers, r.content, data, path)
    assert out.ok, out.summary()


def test_schemathesis_openapi(main_service: rel.ServiceProcess) -> None:
    out = rel.run_schemathesis(main_service.url, max_examples=10, api_key=KEY, seed=9, time_limit_s=240,
                               phases="examples,coverage,fuzzing")
    rel_skip = out.skipped
    if rel_skip:
        pytest.skip(rel_skip)
    assert out.ok, out.summary()
    assert out.sent >= 200, out.summary()


def test_405_allow_lists_every_method_of_the_path(main_service: rel.ServiceProcess) -> None:
    with httpx.Client(base_url=main_service.url, timeout=30) as c:
        r = c.request("OPTIONS", "/v1/jobs/abc", headers={"X-API-Key": KEY})
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert r.headers["allow"] == "DELETE, GET"
        assert c.put("/v1/couplets").headers["allow"] == "POST"
