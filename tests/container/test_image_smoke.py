"""The image for real, with podman: build it (scripts/build-image.sh: the base from Debian
packages, the CPU torch wheel, the Dockerfile; layers cached between runs), run it with
``--network host`` as a non-root user, wait for ``/readyz``, ask for a couplet (200, a 下联 as
long as the 上联), run the same image as ``chunlian worker`` on a job, then stop both the way
an orchestrator does (SIGTERM, then SIGKILL after the grace period): both exit 0 within it.

When podman cannot start a container on this machine the test is skipped and the run ends with
one line saying why (tests/container/conftest.py); a failing build is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import httpx
import pytest

from chunlian.cluster.procs import free_port, http_status
from chunlian.text import is_han
from tests.container.conftest import ROOT

pytestmark = [pytest.mark.container, pytest.mark.integration, pytest.mark.timeout(1500)]

GRACE_S = 40  # the instance's drain (CHUNLIAN_DRAIN_TIMEOUT_S 30) + margin, as in deploy/
REDIS_URL = "redis://127.0.0.1:6379/10"


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def _run(image: str, name: str, env: dict[str, str], *command: str) -> None:
    flags = [f"--env={k}={v}" for k, v in env.items()]
    started = _podman("run", "--detach", "--name", name, "--network", "host", *flags, image, *command)
    assert started.returncode == 0, started.stderr


def _stop(name: str) -> tuple[int, float]:
    """``podman stop``: SIGTERM (the image's STOPSIGNAL), SIGKILL after GRACE_S; the exit
    code and how long it took."""
    t0 = time.monotonic()
    stopped = _podman("stop", "--time", str(GRACE_S), name, timeout=GRACE_S + 60)
    assert stopped.returncode == 0, stopped.stderr
    state = json.loads(_podman("inspect", "--format", "{{json .State}}", name).stdout)
    return int(state["ExitCode"]), time.monotonic() - t0


def test_the_image_serves_runs_a_worker_and_stops_cleanly(image: str) -> None:
    port = free_port()
    instance, worker = f"chunlian-smoke-{uuid.uuid4().hex[:8]}", f"chunlian-smoke-worker-{uuid.uuid4().hex[:8]}"
    common = {"CHUNLIAN_TORCH_THREADS": "1", "CHUNLIAN_ENGINE_REPLICAS": "1",
              "CHUNLIAN_BROKER_URL": REDIS_URL, "CHUNLIAN_JOB_QUEUE": f"smoke-{instance}"}
    t0 = time.monotonic()
    try:
        _run(image, instance, {**common, "CHUNLIAN_PORT": str(port), "CHUNLIAN_WARMUP": "",
                               "CHUNLIAN_REDIS_URL": REDIS_URL})
        deadline = time.monotonic() + 180
        while http_status("127.0.0.1", port, "/readyz") != 200:
            running = _podman("inspect", "--format", "{{.State.Running}}", instance).stdout.strip()
            assert running == "true", _podman("logs", instance).stderr[-3000:]
            assert time.monotonic() < deadline, "not ready in 180 s"
            time.sleep(0.25)
        ready_s = time.monotonic() - t0
        upper = "春回大地千山秀"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            r = c.post("/v1/couplets", json={"upper": upper, "regenerate": True})
            assert r.status_code == 200, r.text
            lower = r.json()["lower"]
            assert len(lower) == len(upper) and all(is_han(ch) for ch in lower), lower
            assert len(r.json()["hengpi"]) == 4
            assert _podman("exec", instance, "id", "-u").stdout.strip() == "10001"  # not root
            assert _podman("healthcheck", "run", instance).returncode == 0  # the image's HEALTHCHECK
            # the same image as a Celery worker, its items through the instance's engine
            _run(image, worker, {**common, "CHUNLIAN_WORKER_ENGINE_URL": f"http://127.0.0.1:{port}"},
                 "worker", "--concurrency", "1")
            job = c.post("/v1/jobs", json={"items": [{"upper": upper}, {"upper": "天增岁月人增寿"}]})
            assert job.status_code == 202, job.text
            job_url = f"/v1/jobs/{job.json()['job_id']}"
            deadline = time.monotonic() + 180
            while (body := c.get(job_url).json())["status"] != "done":
                assert time.monotonic() < deadline, (body, _podman("logs", worker).stderr[-3000:])
                time.sleep(0.5)
            assert [e["status"] for e in body["results"]] == ["done", "done"]
        worker_code, worker_s = _stop(worker)
        code, stop_s = _stop(instance)
        logs = _podman("logs", instance)
        assert code == 0, (logs.stdout + logs.stderr)[-3000:]
        assert stop_s < GRACE_S, stop_s
        assert "drained in" in logs.stdout + logs.stderr
        assert worker_code == 0 and worker_s < GRACE_S, _podman("logs", worker).stderr[-3000:]
        print(f"smoke: ready {ready_s:.1f} s after `podman run`; instance exit 0 {stop_s:.2f} s after SIGTERM, "
              f"worker exit 0 {worker_s:.2f} s after; whole test {time.monotonic() - t0:.1f} s")
    finally:
        for name in (worker, instance):
            _podman("rm", "--force", "--time", "0", name)


def test_the_image_holds_the_weights_and_the_cpu_torch(image: str) -> None:
    probe = _podman("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c",
                    "import torch, json; from chunlian.model.checkpoint import DEFAULT_WEIGHTS as w;"
                    "print(json.dumps([torch.__version__, torch.version.cuda, w.is_file()]))")
    assert probe.returncode == 0, probe.stderr
    version, cuda, weights = json.loads(probe.stdout)
    pin = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"torch==' in line)
    assert version == pin.split("==")[1].split('"')[0] + "+cpu" and cuda is None and weights is True
    assert os.path.exists(ROOT / ".whl")  # the wheel came from a file, not an index


def test_the_image_holds_the_serving_set_only(image: str) -> None:
    """No extra in the image: uvicorn's fast loop and parser are there, evaluation (sacrebleu)
    and uvicorn's development pieces (file watching, websockets) are not."""
    code = ("import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
            "('uvloop', 'httptools', 'psutil', 'sacrebleu', 'lxml', 'watchfiles', 'websockets', 'yaml', 'matplotlib')}))")
    probe = _podman("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", code)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert {m for m, there in found.items() if there} == {"uvloop", "httptools", "psutil"}
