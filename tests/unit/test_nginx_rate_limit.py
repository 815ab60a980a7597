"""The per-client rate limit in the rendered nginx config (no nginx needed; the real nginx
enforcing it is tests/integration/test_nginx_rate_limit.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from chunlian.cluster.nginx import NginxConfig, render
from chunlian.config import load_settings
from chunlian.errors import ConfigError


def _cfg(tmp_path: Path, **kw: object) -> NginxConfig:
    return NginxConfig(upstreams=("127.0.0.1:9001",), prefix=tmp_path / "ng", **kw)  # type: ignore[arg-type]


def _block(conf: str, head: str) -> str:
    m = re.search(re.escape(head) + r" \{(.*?)\n\s*\}", conf, re.S)
    assert m, f"no block {head!r}"
    return m.group(1)


def test_off_by_default_every_client_key_is_empty(tmp_path: Path) -> None:
    conf = render(_cfg(tmp_path))
    assert re.search(r"default 0;", _block(conf, "geo $chunlian_rate_limited"))
    # the limit is wired where it belongs, so turning it on changes only values
    for loc in ("location /v1/couplets", "location /v1/jobs"):
        assert "limit_req zone=chunlian_clients burst=20 nodelay;" in _block(conf, loc)
    for loc in ("location = /nginx-health", "location /"):
        assert "limit_req" not in _block(conf, loc)
    assert "set_real_ip_from" not in conf and "{{" not in conf
    assert "limit_req_dry_run off;" in conf and "limit=$limit_req_status" in conf
    assert "limit_req_dry_run on;" in render(_cfg(tmp_path, client_rate_per_s=1, rate_limit_dry_run=True))


def test_a_burst_of_zero_is_no_burst_parameter(tmp_path: Path) -> None:
    # nginx -t refuses "burst=0" (its default); the observability test runs this config in nginx
    conf = render(_cfg(tmp_path, client_rate_per_s=1, client_burst=0))
    assert "limit_req zone=chunlian_clients nodelay;" in _block(conf, "location /v1/couplets")
    assert "burst=" not in conf and "(burst 0)" in conf


def test_on_limits_per_address_with_the_service_error_shape(tmp_path: Path) -> None:
    conf = render(_cfg(tmp_path, client_rate_per_s=5, client_burst=7, rate_limit_exempt=("10.0.0.0/8", "::1"),
                       trusted_proxies=("192.168.1.7",)))
    geo = _block(conf, "geo $chunlian_rate_limited")
    assert "default 1;" in geo and "10.0.0.0/8 0;" in geo and "::1/128 0;" in geo
    assert "limit_req_zone $chunlian_client_key zone=chunlian_clients:10m rate=5r/s;" in conf
    assert "limit_req zone=chunlian_clients burst=7 nodelay;" in _block(conf, "location /v1/couplets")
    assert "limit_req_status 429;" in conf and "error_page 429 @rate_limited;" in conf
    assert "set_real_ip_from 192.168.1.7/32;" in conf and "real_ip_header X-Forwarded-For;" in conf
    limited = _block(conf, "location @rate_limited")
    assert "add_header Retry-After 1 always;" in limited
    assert '"code":"rate_limited"' in limited and "5 requests/s (burst 7)" in limited
    assert "add_header X-Request-Id $chunlian_request_id always;" in limited


@pytest.mark.parametrize(("rate", "directive", "retry_after_s", "text"), [
    (2, "2r/s", 1, "2 requests/s"),
    (2.5, "150r/m", 1, "2.5 requests/s"),
    (0.5, "30r/m", 2, "30 requests/min"),
    (1 / 60, "1r/m", 60, "1 request/min"),
])
def test_fractional_rates_become_per_minute(tmp_path: Path, rate: float, directive: str, retry_after_s: int,
                                            text: str) -> None:
    cfg = _cfg(tmp_path, client_rate_per_s=rate)
    assert cfg.client_rate_directive == directive and cfg.retry_after_s == retry_after_s
    conf = render(cfg)
    assert f"rate={directive};" in conf and f"Retry-After {retry_after_s} always" in conf and text in conf


@pytest.mark.parametrize(("kw", "words"), [
    ({"client_rate_per_s": -1}, "client rate"),
    ({"client_rate_per_s": 0.001}, "at least 1 request a minute"),
    ({"client_rate_per_s": float("nan")}, "client rate"),
    ({"client_burst": -1}, "client burst"),
    ({"rate_limit_zone_mb": 0}, "zone"),
    ({"rate_limit_exempt": ("10.0.0.0/33",)}, "exempt address"),
    ({"trusted_proxies": ("cdn.example.com",)}, "trusted proxy"),
])
def test_bad_rate_limit_parameters_name_the_problem(tmp_path: Path, kw: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        render(_cfg(tmp_path, **kw))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chunlian.cli", "cluster", "--print-nginx-config",
                           "--upstream", "10.0.1.11:8000", *args], capture_output=True, text=True, timeout=60)


def test_cli_renders_the_flags_and_refuses_bad_ones() -> None:
    ok = _cli("--client-rate", "3", "--client-burst", "9", "--rate-limit-exempt", "10.0.0.0/8",
              "--trusted-proxy", "172.16.0.0/12")
    assert ok.returncode == 0, ok.stderr
    assert "rate=3r/s;" in ok.stdout and "burst=9 nodelay;" in ok.stdout
    assert "10.0.0.0/8 0;" in ok.stdout and "set_real_ip_from 172.16.0.0/12;" in ok.stdout
    bad = _cli("--trusted-proxy", "not-an-address")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "trusted proxy" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("host", "workers", "own_model", "rate", "exempt"), [
    ("127.0.0.1", 1, False, 2.0, ("10.0.0.0/8", "127.0.0.1")),  # items through nginx: exempt
    ("::", 1, False, 2.0, ("10.0.0.0/8", "::1")),  # a wildcard listen is dialled on loopback
    ("127.0.0.1", 0, False, 2.0, ("10.0.0.0/8",)),  # no workers
    ("127.0.0.1", 1, True, 2.0, ("10.0.0.0/8",)),  # workers with their own model never call nginx
    ("127.0.0.1", 1, False, 0.0, ("10.0.0.0/8",)),  # no limit, nothing to exempt
])
def test_the_cluster_exempts_its_own_workers_from_the_client_rate(
    host: str, workers: int, own_model: bool, rate: float, exempt: tuple[str, ...],
) -> None:
    from chunlian.cluster.launcher import Cluster, ClusterSpec

    said: list[str] = []
    spec = ClusterSpec(host=host, port=8000, workers=workers, worker_own_model=own_model,
                       nginx_options={"client_rate_per_s": rate, "rate_limit_exempt": ("10.0.0.0/8",)})
    options = Cluster(spec, load_settings(environ={}), say=said.append)._nginx_options(with_workers=True)
    assert options["rate_limit_exempt"] == exempt and options["client_rate_per_s"] == rate
    assert bool(said) == (len(exempt) == 2)


def test_nginx_refusals_are_readable_by_the_allowed_pages(tmp_path: Path) -> None:
    off = render(_cfg(tmp_path))
    assert 'default "";' in _block(off, "map $http_origin $chunlian_cors_origin") and '$http_origin;' not in off
    conf = render(_cfg(tmp_path, cors_origins=("https://fu.example.com",)))
    assert '"https://fu.example.com" $http_origin;' in _block(conf, "map $http_origin $chunlian_cors_origin")
    for loc in ("location @rate_limited", "location @too_large", "location @unavailable"):
        assert "add_header Access-Control-Allow-Origin $chunlian_cors_origin always;" in _block(conf, loc)
    # no instance answering is a 503 with Retry-After (what clients retry), not nginx's own 502/504;
    # the observability test sees the 503 from a real nginx
    assert "error_page 502 504 =503 @unavailable;" in conf
    assert 'default "*";' in render(_cfg(tmp_path, cors_origins=("*",)))
    with pytest.raises(ConfigError, match="cors origins"):
        render(_cfg(tmp_path, cors_origins=("https://a.example/path",)))


def test_the_campaign_page_is_cached_by_nginx_unless_off(tmp_path: Path) -> None:
    conf = render(_cfg(tmp_path))
    for loc in ("location = /", "location /static/"):
        block = _block(conf, loc)
        assert "proxy_cache chunlian_page;" in block and "proxy_cache_valid 200 60s;" in block
        assert "expires 60s;" in block and "add_header X-Request-Id $chunlian_request_id always;" in block
        assert "proxy_cache_use_stale error timeout updating http_502 http_503 http_504;" in block
    assert "proxy_cache" not in _block(conf, "location /v1/couplets")  # the API never
    assert "gzip_types text/css text/javascript application/javascript image/svg+xml;" in conf
    off = render(_cfg(tmp_path, page_cache_s=0))
    assert "proxy_cache off;" in _block(off, "location = /") and "expires off;" in _block(off, "location /static/")
    with pytest.raises(ConfigError, match="page cache"):
        render(_cfg(tmp_path, page_cache_s=-1))


def test_a_prefix_nobody_can_reach_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chunlian.cluster import nginx

    shut = tmp_path / "shut"
    (shut / "inside").mkdir(parents=True)
    shut.chmod(0o700)
    monkeypatch.setattr(nginx.os, "geteuid", lambda: 0)
    assert nginx.page_cache_blocker(shut / "inside" / "nginx") == shut
    shut.chmod(0o711)
    blocker = nginx.page_cache_blocker(shut / "inside" / "nginx")
    assert blocker is None or blocker not in (shut, shut / "inside")  # pytest's own dirs may be 0700
    monkeypatch.setattr(nginx.os, "geteuid", lambda: 1000)
    shut.chmod(0o700)
    assert nginx.page_cache_blocker(shut / "inside" / "nginx") is None  # not root: workers are us


def test_cli_takes_the_instances_limits_from_their_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNLIAN_BODY_LIMIT_BYTES", "2048")
    monkeypatch.setenv("CHUNLIAN_DEFAULT_TIMEOUT_MS", "45000")  # longer than nginx's own 30 s
    ok = _cli()
    assert ok.returncode == 0, ok.stderr
    assert "client_max_body_size 2048;" in ok.stdout and "proxy_read_timeout 50s;" in ok.stdout
    monkeypatch.setenv("CHUNLIAN_BODY_LIMIT_BYTES", "12")
    bad = _cli()
    assert bad.returncode == 2 and "CHUNLIAN_BODY_LIMIT_BYTES" in bad.stderr and "'12'" in bad.stderr


def test_the_cluster_reads_the_settings_it_passes_on(tmp_path: Path) -> None:
    from chunlian.cluster.launcher import ClusterSpec
    from chunlian.cluster.spec import nginx_config

    env = {"CHUNLIAN_BODY_LIMIT_BYTES": "4096", "CHUNLIAN_CORS_ORIGINS": "https://fu.example.com"}
    cfg, _ = nginx_config(ClusterSpec(), load_settings(environ=env), [9001], tmp_path, dict)
    assert (cfg.body_limit_bytes, cfg.cors_origins, cfg.deadline_s) == (4096, ("https://fu.example.com",), 30.0)
    with pytest.raises(ConfigError, match="CHUNLIAN_CORS_ORIGINS"):
        load_settings(environ={"CHUNLIAN_CORS_ORIGINS": "fu.example.com"})
    with pytest.raises(ConfigError, match="body_limit_bytes"):
        render(_cfg(tmp_path, body_limit_bytes=1000))
