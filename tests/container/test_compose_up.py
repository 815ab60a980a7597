"""deploy/compose brought up for real: Debian's ``docker-compose`` talking to podman's Docker API
(``podman system service`` on a socket of the test's own), the project's image, and for Redis,
nginx and Prometheus the Debian-built stand-ins of scripts/build-compose-images.sh (this host has
no image registry). Grafana has no Debian package, so it is the one service left out.

Through the one published port: the campaign page, a couplet (200, a 下联 as long as the 上联), a
bulk job run by the Celery worker through nginx to the instances. Prometheus finds both instances
through Compose's DNS and scrapes them, and holds the project's alert rules. Then
``docker-compose stop`` stops everything within the grace periods, the instances and the worker
with exit 0. Which instances answered is printed, not asserted (nginx's least_conn decides).

podman runs a container's healthcheck only when something schedules it (systemd timers, which
this host has not); ``depends_on: condition: service_healthy`` waits on those checks, so the test
runs them every 2 s itself (``podman healthcheck run``), as systemd would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunlian.cluster.procs import free_port
from chunlian.text import is_han
from tests.container.conftest import ROOT

pytestmark = [pytest.mark.container, pytest.mark.integration, pytest.mark.timeout(1500)]

COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
STANDINS = {name: f"localhost/chunlian-compose-{name.split('_')[0].lower()}:bookworm"
            for name in ("REDIS_IMAGE", "NGINX_IMAGE", "PROMETHEUS_IMAGE")}
SERVICES = ["redis", "instance", "worker", "nginx-config", "nginx", "nginx-exporter", "prometheus"]
UP_S = 420  # two instances loading the model on a shared 2-core host, then nginx


@pytest.fixture(scope="module")
def standins(image: str) -> str:
    build = subprocess.run([str(ROOT / "scripts" / "build-compose-images.sh")], cwd=ROOT, capture_output=True,
                           text=True, timeout=900, check=False)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    return image


@pytest.fixture()
def compose_env(standins: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """podman's Docker API on a socket in tmp_path, and the environment docker-compose needs."""
    sock = tmp_path / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None and time.monotonic() < deadline, "podman system service did not start"
            time.sleep(0.1)
        yield {**os.environ, **STANDINS, "DOCKER_HOST": f"unix://{sock}", "DEPLOY_IMAGE": standins,
               "DEPLOY_PORT": str(free_port()), "PROMETHEUS_PORT": str(free_port()), "DEPLOY_INSTANCES": "2",
               "COMPOSE_PROJECT_NAME": f"chunlian-test-{os.getpid()}", "CHUNLIAN_TORCH_THREADS": "1",
               "COMPOSE_HTTP_TIMEOUT": "300"}
    finally:
        service.terminate()
        service.wait(timeout=30)


class HealthcheckTicker:
    """``podman healthcheck run`` on every running container of one Compose project, every
    ``interval_s``, until stopped: the scheduling systemd does for podman elsewhere."""

    def __init__(self, project: str, interval_s: float = 2.0) -> None:
        self.project, self.interval_s = project, interval_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="healthchecks", daemon=True)

    def __enter__(self) -> HealthcheckTicker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            names = subprocess.run(
                ["podman", "ps", "--filter", f"label=com.docker.compose.project={self.project}",
                 "--format", "{{.Names}}"], capture_output=True, text=True, timeout=30, check=False).stdout.split()
            for name in names:  # a container without a healthcheck just says so
                subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, timeout=30, check=False)


def _compose(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("docker-compose")
    assert tool is not None, "docker-compose is not installed (scripts/install-containers.sh)"
    return subprocess.run([tool, "-f", str(COMPOSE), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _wait_for_page(base: str, env: dict[str, str]) -> None:
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.get(f"{base}/", timeout=5)
            if r.status_code == 200 and "春联" in r.text:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < UP_S, _compose(env, "logs", "--tail", "40").stdout[-6000:]
        time.sleep(1)


def _prometheus_sees_both_instances(env: dict[str, str]) -> dict[str, int]:
    prom = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}"
    deadline = time.monotonic() + 90  # DNS refresh 15 s, scrape every 5 s
    while True:
        targets = httpx.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        up = [t for t in targets if t["labels"]["job"] == "chunlian" and t["health"] == "up"]
        if len(up) == 2:
            break
        assert time.monotonic() < deadline, targets
        time.sleep(2)
    rules = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
    return {"instances_up": len(up), "alert_rules": sum(len(g["rules"]) for g in rules)}


def test_compose_up_serves_the_page_couplets_and_jobs(compose_env: dict[str, str]) -> None:
    env = compose_env
    base = f"http://127.0.0.1:{env['DEPLOY_PORT']}"
    t0 = time.monotonic()
    try:
        with HealthcheckTicker(env["COMPOSE_PROJECT_NAME"]):
            _bring_up_and_use(env, base, t0)
    finally:
        _compose(env, "down", "--volumes", "--timeout", "5", timeout=300)


def _bring_up_and_use(env: dict[str, str], base: str, t0: float) -> None:
    t_up = time.monotonic()
    up = _compose(env, "up", "-d", *SERVICES)
    assert up.returncode == 0, up.stderr[-4000:]
    _wait_for_page(base, env)
    page_s = time.monotonic() - t_up
    upper = "春回大地千山秀"
    with httpx.Client(base_url=base, timeout=60) as c:
        r = c.post("/v1/couplets", json={"upper": upper, "regenerate": True})
        assert r.status_code == 200, r.text
        lower = r.json()["lower"]
        assert len(lower) == len(upper) and all(is_han(ch) for ch in lower), lower
        served_by = {c.post("/v1/couplets", json={"upper": u, "regenerate": True}).headers.get("x-chunlian-instance")
                     for u in ("天增岁月人增寿", "春满乾坤福满门", "一帆风顺年年好", "万事如意步步高")}
        job = c.post("/v1/jobs", json={"items": [{"upper": upper}, {"upper": "天增岁月人增寿"}]})
        assert job.status_code == 202, job.text
        job_url = f"/v1/jobs/{job.json()['job_id']}"
        deadline = time.monotonic() + 180
        while (body := c.get(job_url).json())["status"] != "done":
            assert time.monotonic() < deadline, (body, _compose(env, "logs", "worker").stdout[-3000:])
            time.sleep(0.5)
        assert [e["status"] for e in body["results"]] == ["done", "done"]
    prom = _prometheus_sees_both_instances(env)
    assert prom["alert_rules"] > 0, prom
    t_stop = time.monotonic()
    stop = _compose(env, "stop", "--timeout", "75")  # SIGTERM (nginx: SIGQUIT), then the grace period
    assert stop.returncode == 0, stop.stderr[-3000:]
    stop_s = time.monotonic() - t_stop
    codes = _exit_codes(env["COMPOSE_PROJECT_NAME"])
    assert all(codes[s] == [0] * len(codes[s]) for s in ("instance", "worker")), codes  # drained
    print(f"\ncompose: page served {page_s:.1f} s after `up`; answered by {sorted(map(str, served_by))}; "
          f"prometheus {prom}; stopped in {stop_s:.1f} s, exit codes {codes}; whole test {time.monotonic() - t0:.1f} s")


def _exit_codes(project: str) -> dict[str, list[int]]:
    """Each service's containers' exit codes, by Compose's service label."""
    ps = subprocess.run(["podman", "ps", "--all", "--filter", f"label=com.docker.compose.project={project}",
                         "--format", '{{index .Labels "com.docker.compose.service"}} {{.ExitCode}}'],
                        capture_output=True, text=True, timeout=60, check=True)
    codes: dict[str, list[int]] = {}
    for line in ps.stdout.splitlines():
        service, code = line.split()
        codes.setdefault(service, []).append(int(code))
    return codes
