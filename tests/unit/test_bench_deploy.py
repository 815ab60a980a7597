"""The shipped alert rules, scrape config and dashboard: well formed and complete. (That
their metric names exist in a real /metrics is tests/integration/test_observability.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from chunlian.api.metrics import ENGINE_COUNTERS, ENGINE_GAUGES

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
PROM = ROOT / "deploy" / "prometheus" / "prometheus.yml"


def _rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_has_a_runbook_a_severity_and_a_duration() -> None:
    rules = _rules()
    assert len({r["alert"] for r in rules}) == len(rules)
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["runbook"].strip(), r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]


def test_the_asked_for_alerts_are_there() -> None:
    exprs = {r["alert"]: r["expr"] for r in _rules()}
    wanted = {  # what the issue asks for -> a metric its rule must read
        "ChunlianHighP99Latency": "chunlian_http_request_duration_seconds_bucket",
        "ChunlianQueueNearFull": "chunlian_queue_capacity",
        "ChunlianOverloadRejections": "chunlian_overload_rejections_total",
        "ChunlianHigh5xxRate": 'status=~"5.."',
        "ChunlianCacheHitRatioDrop": "chunlian_cache_requests_total",
        "ChunlianRedisDown": "chunlian_redis_up",
        "ChunlianDeadlineDrops": "chunlian_deadline_drops_total",
        "ChunlianGpuUnderutilisedUnderLoad": "chunlian_gpu_utilization_ratio",
    }
    for alert, needle in wanted.items():
        assert needle in exprs[alert], alert


def test_scrape_config_loads_the_rules() -> None:
    doc = yaml.safe_load(PROM.read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["alerts.yml"]
    job = doc["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]


def test_dashboard_panels_cover_the_asked_for_figures() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for needle in ("chunlian_http_requests_total", "chunlian_http_request_duration_seconds_bucket",
                   "chunlian_engine_batch_size_", "chunlian_queue_depth", "chunlian_cache_requests_total",
                   "chunlian_generated_tokens_total", "chunlian_gpu_utilization_ratio"):
        assert needle in exprs, needle
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        # the instance picker filters every panel, except nginx's: the front is one for all
        # instances, and its exporter's series carry the exporter's address as instance
        front_only = all("chunlian_nginx_" in t["expr"] for t in p["targets"])
        assert front_only or all('instance=~"$instance"' in t["expr"] for t in p["targets"]), p["title"]
        assert not front_only or not any("$instance" in t["expr"] for t in p["targets"]), p["title"]
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "instance"}


def test_engine_metric_names_used_are_declared() -> None:
    declared = {f"{n}_total" for n, _, _ in ENGINE_COUNTERS} | {n for n, _, _ in ENGINE_GAUGES}
    text = ALERTS.read_text(encoding="utf-8") + DASHBOARD.read_text(encoding="utf-8")
    engine_like = {m for m in re.findall(r"\bchunlian_[a-z0-9_]+", text)
                   if m.startswith(("chunlian_queue", "chunlian_engine_running", "chunlian_deadline",
                                    "chunlian_overload", "chunlian_generated", "chunlian_coalesced"))}
    assert engine_like <= declared
