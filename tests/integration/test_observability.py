"""The alert rules and the dashboard against a real server's /metrics.

A real server (uvicorn, the real engine, a Redis URL so that ``chunlian_redis_up`` is
exported) answers a few requests; then every metric name used by an expression in
``deploy/prometheus/alerts.yml`` and by a query in ``deploy/grafana/dashboard.json`` must
appear in its ``/metrics``. The rule file is checked, and its alerts exercised on synthetic
series, with ``promtool`` when it is installed (``scripts/install-promtool.sh``; CI has it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from chunlian.config import load_settings
from tests.integration.live_server import LiveServer, exporter_running, model_path, nginx_front

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
REDIS_URL = "redis://127.0.0.1:6379/13"

# Exported only when the engine runs on cuda (ServiceMetrics' collector, api/metrics.py); a CPU
# test server cannot show them. Exactly these two are allowed to be missing.
GPU_ONLY = {"chunlian_gpu_utilization_ratio", "chunlian_gpu_memory_bytes"}

_NAME = re.compile(r"\bchunlian_[a-z0-9_]+")
_SUFFIXES = ("_bucket", "_sum", "_count")


def alert_exprs() -> list[str]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    """Every target ``expr`` and variable query in the dashboard."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "query", "definition") and isinstance(v, str):
                    out.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text(encoding="utf-8")))
    return out


def names_in(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in _NAME.findall(e)}


def exported_names(text: str) -> set[str]:
    """Sample names and family names (``# TYPE``) in an exposition."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def missing(used: set[str], exported: set[str]) -> set[str]:
    def known(name: str) -> bool:
        if name in exported:
            return True
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in exported:
                return True
        return False

    return {n for n in used if not known(n)}


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    weights = model_path(tmp_path_factory.mktemp("model"))
    settings = load_settings(
        model_path=weights, device="cpu", max_batch_size=8, instance_id="itest-observability",
        warmup=("新春",), torch_threads=1, redis_url=REDIS_URL,
    )
    server = LiveServer(settings).start()
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            for upper in ("春回大地千山秀", "春回大地千山秀", "天增岁月人增寿"):
                assert c.post("/v1/couplets", json={"upper": upper, "regenerate": upper == "天增岁月人增寿"}).status_code == 200
            assert c.post("/v1/couplets", json={"upper": "abc"}).status_code == 422
            r = c.get("/metrics")
            assert r.status_code == 200
            yield r.text
    finally:
        server.stop()


@pytest.fixture(scope="module")
def nginx_metrics_text(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The nginx exporter's /metrics, following a real nginx (per-client rate on, no live
    upstream: nginx answers everything itself) that refused some requests."""
    import time

    from chunlian.cluster.procs import free_port

    with nginx_front(tmp_path_factory.mktemp("nginx"), [free_port()], client_rate_per_s=0.1, client_burst=0) as front, \
            exporter_running(front) as url:
        with httpx.Client(base_url=front.url, timeout=30) as c:
            codes = [c.post("/v1/couplets", json={"upper": "春回大地千山秀"}).status_code for _ in range(3)]
        assert codes == [503, 429, 429]  # no instance answers (503, not nginx's 502); then over the rate
        deadline = time.monotonic() + 30
        while 'chunlian_nginx_limit_req_total{state="REJECTED"} 2.0' not in (text := httpx.get(url).text):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        yield text


def test_the_files_use_some_metrics() -> None:
    assert len(names_in(alert_exprs())) >= 8
    assert len(names_in(dashboard_queries())) >= 12


def test_gpu_allowlist_names_are_real() -> None:
    source = (ROOT / "src" / "chunlian" / "api" / "metrics.py").read_text(encoding="utf-8")
    for name in GPU_ONLY:
        assert f'"{name}"' in source, name


def test_every_alert_metric_is_exported(metrics_text: str, nginx_metrics_text: str) -> None:
    used = names_in(alert_exprs())
    assert "chunlian_redis_up" in exported_names(metrics_text)  # the Redis URL made it appear
    exported = exported_names(metrics_text) | exported_names(nginx_metrics_text)
    assert missing(used, exported) <= GPU_ONLY
    assert any(n.startswith("chunlian_nginx_") for n in used)  # the exporter's are checked too


def test_every_dashboard_metric_is_exported(metrics_text: str, nginx_metrics_text: str) -> None:
    used = names_in(dashboard_queries())
    exported = exported_names(metrics_text) | exported_names(nginx_metrics_text)
    assert missing(used, exported) <= GPU_ONLY
    assert {"chunlian_nginx_limit_req_total", "chunlian_nginx_connections"} <= used


def test_gpu_metrics_absent_on_cpu(metrics_text: str) -> None:
    assert not GPU_ONLY & exported_names(metrics_text)


def test_missing_detects_a_typo() -> None:
    exported = {"chunlian_queue_depth", "chunlian_http_request_duration_seconds"}
    assert missing({"chunlian_queue_depht", "chunlian_http_request_duration_seconds_bucket"}, exported) == {
        "chunlian_queue_depht"}


# ---- promtool ---------------------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/install-promtool.sh)")


@needs_promtool
def test_promtool_check_rules() -> None:
    out = subprocess.run([PROMTOOL or "promtool", "check", "rules", str(ALERTS)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_check_config() -> None:
    out = subprocess.run([PROMTOOL or "promtool", "check", "config", str(PROM_CONFIG)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


RULE_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'chunlian_queue_depth{{instance="a", job="chunlian"}}'
        values: '900x20'
      - series: 'chunlian_queue_capacity{{instance="a", job="chunlian"}}'
        values: '1024x20'
      - series: 'chunlian_redis_up{{instance="a", job="chunlian"}}'
        values: '1 0x10'
      - series: 'chunlian_overload_rejections_total{{instance="a", job="chunlian"}}'
        values: '0+60x20'
      - series: 'chunlian_ready{{instance="a", job="chunlian"}}'
        values: '1x20'
      - series: 'chunlian_http_requests_total{{instance="a", job="chunlian", endpoint="/v1/couplets", status="200"}}'
        values: '0+600x20'
      - series: 'chunlian_http_requests_total{{instance="a", job="chunlian", endpoint="/v1/couplets", status="504"}}'
        values: '0+60x20'
      - series: 'chunlian_gpu_utilization_ratio{{instance="a", job="chunlian"}}'
        values: '0.1x30'
    alert_rule_test:
      - eval_time: 5m
        alertname: ChunlianQueueNearFull
        exp_alerts:
          - exp_labels: {{severity: critical, instance: a, job: chunlian}}
      - eval_time: 5m
        alertname: ChunlianRedisDown
        exp_alerts:
          - exp_labels: {{severity: critical, instance: a, job: chunlian}}
      - eval_time: 12m
        alertname: ChunlianOverloadRejections
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a}}
      - eval_time: 12m
        alertname: ChunlianHigh5xxRate
        exp_alerts:
          - exp_labels: {{severity: critical, instance: a}}
      - eval_time: 20m
        alertname: ChunlianGpuUnderutilisedUnderLoad
        exp_alerts:
          - exp_labels: {{severity: warning, instance: a, job: chunlian}}
      - eval_time: 5m
        alertname: ChunlianNotReady
        exp_alerts: []
  # the per-client rate: 9% of requests refused for 10 min fires; 1% never does
  - interval: 1m
    input_series:
      - series: 'chunlian_nginx_limit_req_total{{instance="ng", job="chunlian-nginx", state="PASSED"}}'
        values: '0+600x30'
      - series: 'chunlian_nginx_limit_req_total{{instance="ng", job="chunlian-nginx", state="REJECTED"}}'
        values: '0+60x30'
      - series: 'chunlian_nginx_limit_req_total{{instance="ng2", job="chunlian-nginx", state="PASSED"}}'
        values: '0+600x30'
      - series: 'chunlian_nginx_limit_req_total{{instance="ng2", job="chunlian-nginx", state="REJECTED"}}'
        values: '0+60x30'
    alert_rule_test:
      - eval_time: 8m
        alertname: ChunlianClientsRateLimited
        exp_alerts: []
      - eval_time: 20m
        alertname: ChunlianClientsRateLimited
        exp_alerts:
          - exp_labels: {{severity: warning}}
  - interval: 1m
    input_series:
      - series: 'chunlian_nginx_limit_req_total{{instance="ng", job="chunlian-nginx", state="PASSED"}}'
        values: '0+600x30'
      - series: 'chunlian_nginx_limit_req_total{{instance="ng", job="chunlian-nginx", state="REJECTED"}}'
        values: '0+6x30'
    alert_rule_test:
      - eval_time: 25m
        alertname: ChunlianClientsRateLimited
        exp_alerts: []
  # bulk jobs: a backlog with nothing finishing for 30 min fires; the same backlog draining does not
  - interval: 1m
    input_series:
      - series: 'chunlian_job_items_pending{{instance="a", job="chunlian"}}'
        values: '50x45'
      - series: 'chunlian_job_items_pending{{instance="b", job="chunlian"}}'
        values: '50x45'
      - series: 'chunlian_job_items_finished{{instance="a", job="chunlian"}}'
        values: '100x45'
      - series: 'chunlian_job_items_finished{{instance="b", job="chunlian"}}'
        values: '100x45'
      - series: 'chunlian_jobs_monitor_ok{{instance="a", job="chunlian"}}'
        values: '1x45'
    alert_rule_test:
      - eval_time: 20m
        alertname: ChunlianJobBacklogStuck
        exp_alerts: []
      - eval_time: 40m
        alertname: ChunlianJobBacklogStuck
        exp_alerts:
          - exp_labels: {{severity: warning}}
  - interval: 1m
    input_series:
      - series: 'chunlian_job_items_pending{{instance="a", job="chunlian"}}'
        values: '500-5x45'
      - series: 'chunlian_job_items_finished{{instance="a", job="chunlian"}}'
        values: '0+5x45'
      - series: 'chunlian_jobs_monitor_ok{{instance="a", job="chunlian"}}'
        values: '1x45'
    alert_rule_test:
      - eval_time: 40m
        alertname: ChunlianJobBacklogStuck
        exp_alerts: []
"""


@needs_promtool
def test_promtool_alerts_fire_on_synthetic_series(tmp_path: Path) -> None:
    # promtool compares annotations too; the expressions, durations and labels are what is
    # tested here, so the rules run without their (templated) annotations
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(doc), encoding="utf-8")
    spec = tmp_path / "alerts_test.yml"
    spec.write_text(RULE_TESTS.format(alerts=json.dumps(str(rules))), encoding="utf-8")
    out = subprocess.run([PROMTOOL or "promtool", "test", "rules", str(spec)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
