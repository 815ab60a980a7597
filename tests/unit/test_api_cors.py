"""Cross-origin calls (``CHUNLIAN_CORS_ORIGINS``): a campaign page on another site may call
the API; others get no CORS headers (the browser blocks them) and a refused preflight is in
the service's error shape. Off by default."""

from __future__ import annotations

import pytest

from chunlian.config import load_settings
from chunlian.errors import ConfigError
from tests.unit.api_fakes import running_app

PAGE = "https://fu.example.com"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,x-request-id"}
BODY = {"upper": "春回大地千山秀"}


async def test_an_allowed_page_may_call_and_read_the_ids() -> None:
    async with running_app(cors_origins=f"{PAGE}, http://localhost:8080") as h:
        r = await h.client.options("/v1/couplets", headers={"Origin": PAGE, **PREFLIGHT})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PAGE
        assert "x-request-id" in r.headers["access-control-allow-headers"].lower()
        assert "POST" in r.headers["access-control-allow-methods"] and r.headers["x-request-id"]
        for _ in range(2):  # a miss, then a hit answered by the fast path: both carry the headers
            r = await h.client.post("/v1/couplets", json=BODY, headers={"Origin": PAGE})
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PAGE
            exposed = r.headers["access-control-expose-headers"].lower()
            assert "x-request-id" in exposed and "retry-after" in exposed
        assert r.json()["cached"] is True
        r = await h.client.post("/v1/couplets", json={"upper": "hello"}, headers={"Origin": PAGE})
        assert r.status_code == 422 and r.headers["access-control-allow-origin"] == PAGE  # errors readable too


async def test_another_site_gets_no_cors_headers_and_a_shaped_refusal() -> None:
    async with running_app(cors_origins=PAGE) as h:
        r = await h.client.options("/v1/couplets", headers={"Origin": "https://evil.example", **PREFLIGHT})
        assert r.status_code == 400 and r.headers["x-request-id"]
        err = r.json()["error"]
        assert err["code"] == "cors_refused" and err["field"] == "Origin" and "origin" in err["message"]
        r = await h.client.post("/v1/couplets", json=BODY, headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_off_by_default_and_star_allows_any_page() -> None:
    async with running_app() as h:
        r = await h.client.post("/v1/couplets", json=BODY, headers={"Origin": PAGE})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    async with running_app(cors_origins="*") as h:
        r = await h.client.post("/v1/couplets", json=BODY, headers={"Origin": "https://any.example"})
        assert r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("bad", ["https://fu.example.com/page", "fu.example.com", "*,https://a.example", "ftp://a.b"])
def test_bad_origins_name_the_setting_and_the_value(bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(cors_origins=bad)
    msg = str(e.value)
    assert "CHUNLIAN_CORS_ORIGINS" in msg and bad.split(",")[-1] in msg and "expected" in msg


def test_origins_are_read_from_a_comma_separated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNLIAN_CORS_ORIGINS", " https://a.example , http://[::1]:8080 ,")
    assert load_settings().cors_origins == ("https://a.example", "http://[::1]:8080")


async def test_the_services_own_refusals_are_readable_by_an_allowed_page() -> None:
    # 413 and 431 are answered before the CORS layer; a page must still read them (not a
    # network error) to tell its user the line is too long
    async with running_app(cors_origins=PAGE, body_limit_bytes=1024) as h:
        big = {"upper": "春" * 1000}
        r = await h.client.post("/v1/couplets", json=big, headers={"Origin": PAGE})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        assert r.headers["access-control-allow-origin"] == PAGE and r.headers["vary"] == "Origin"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        r = await h.client.post("/v1/couplets", json=BODY, headers={"Origin": PAGE, "X-Pad": "x" * 20_000})
        assert r.status_code == 431 and r.headers["access-control-allow-origin"] == PAGE
        r = await h.client.post("/v1/couplets", json=big, headers={"Origin": "https://evil.example"})
        assert r.status_code == 413 and "access-control-allow-origin" not in r.headers
    async with running_app(body_limit_bytes=1024) as h:  # CORS off: no headers on refusals either
        r = await h.client.post("/v1/couplets", json=big, headers={"Origin": PAGE})
        assert r.status_code == 413 and "access-control-allow-origin" not in r.headers
