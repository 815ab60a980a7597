"""The scale-out topology for real: ``chunlian cluster`` starts two service instances on the
real Redis (db 14) and nginx in front, all over loopback.

* requests through nginx are spread over both instances (``X-Chunlian-Instance``);
* a couplet generated through one instance is a cache hit through the other (the in-process
  cache is off, ``CHUNLIAN_CACHE_SIZE=0``, so only the shared Redis can produce the hit);
* one instance is SIGKILLed during a stream of idempotent requests and none fails;
* after the launcher gets SIGTERM, nginx and every instance are gone;
* an instance that dies during start-up makes the launcher stop everything and fail.

Nothing here passes or fails on timing: waits are bounded (readiness up to ~150 s, since
this machine may be busy) and the kill is triggered by responses seen, not by a clock.
Leak checks scan /proc for processes carrying this run's marker in their environment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from chunlian.cluster.commands import worker_command
from chunlian.cluster.nginx import ClusterError, NginxConfig, fill, render, template_text
from chunlian.cluster.procs import free_port, http_status
from chunlian.errors import ConfigError
from tests.integration.live_server import model_path, nginx_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REDIS_URL = "redis://127.0.0.1:6379/14"
READY_LIMIT_S = 150.0
MARKER_VAR = "CHUNLIAN_TEST_CLUSTER_MARKER"
WITH_WORKERS = worker_command() is not None
UPPERS = ("春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海")


def _redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.RedisError as e:
        msg = f"Redis is not reachable at {REDIS_URL}: {e}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


# ---- process bookkeeping through /proc -------------------------------------------------------
def _proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """Running (a zombie, already dead and waiting to be reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) not in (None, "Z", "X")


def _marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (the launcher and all its children)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and _alive(int(entry)):
            out.append(int(entry))
    return out


def _environ(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def _ours(marker: str, prefix: Path) -> list[int]:
    """Every live process of one launch: the marked ones (python processes keep their
    environment; nginx rewrites its own for its process title), nginx's master (its title
    names the prefix) and everything in those processes' groups (nginx's workers)."""
    found = set(_marked(marker))
    needle = str(prefix).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes() and _alive(int(entry)):
                    found.add(int(entry))
            except OSError:
                continue
    groups = set()
    for pid in found:
        with contextlib.suppress(OSError):
            groups.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]))
    return sorted(found | set(_in_groups(groups)))


def _in_groups(pgids: set[int]) -> list[int]:
    """Live processes in any of these process groups (nginx workers included)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) in pgids and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def _wait_until(pred: Any, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# ---- the launcher under test -----------------------------------------------------------------
@dataclass
class Launched:
    proc: subprocess.Popen[str]
    info: dict[str, Any]
    marker: str
    stderr: list[str]
    prefix: Path

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def instance_ids(self) -> set[str]:
        return {i["id"] for i in self.info["instances"]}


def _env(marker: str, weights: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNLIAN_")}
    env.update({
        MARKER_VAR: marker,
        "CHUNLIAN_CACHE_SIZE": "0",  # only the shared Redis can produce a hit
        "CHUNLIAN_WARMUP": "",
        "CHUNLIAN_TORCH_THREADS": "1",
        "CHUNLIAN_DEVICE": "cpu",
        "CHUNLIAN_MODEL_PATH": str(weights),
        "CHUNLIAN_MAX_BATCH_SIZE": "16",
        "CHUNLIAN_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


def _launch(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "chunlian.cli", "cluster", *args],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )


def _drain(stream: Any, sink: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: sink.extend(iter(stream.readline, "")), daemon=True)
    t.start()
    return t


def _kill_leftovers(marker: str, pgids: set[int], prefix: Path | None = None) -> None:
    ours = _ours(marker, prefix) if prefix is not None else _marked(marker)
    for pid in set(ours) | set(_in_groups(pgids)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_path(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def cluster(weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    nginx_or_skip()
    _redis_or_skip()
    marker = uuid.uuid4().hex
    prefix = tmp_path_factory.mktemp("cluster")
    port = free_port()
    workers = ["--workers", "1"] if WITH_WORKERS else []  # one Celery worker, when jobs exist
    proc = _launch(
        ["--instances", "2", "--port", str(port), "--redis-url", REDIS_URL, "--torch-threads", "1",
         "--nginx-workers", "1", "--prefix", str(prefix), "--ready-timeout-s", str(READY_LIMIT_S),
         "--nginx-metrics-port", "0", "--json", *workers],
        _env(marker, weights),
    )
    stderr: list[str] = []
    _drain(proc.stderr, stderr)
    lines: list[str] = []
    out_thread = _drain(proc.stdout, lines)
    pgids: set[int] = set()
    try:
        ok = _wait_until(lambda: bool(lines) or proc.poll() is not None, READY_LIMIT_S + 30)
        assert ok and lines, f"the launcher did not report ready; stderr:\n{''.join(stderr)}"
        info = json.loads(lines[0])
        pgids = set(info["pgids"])
        yield Launched(proc, info, marker, stderr, prefix)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        out_thread.join(timeout=5)
        _kill_leftovers(marker, pgids, prefix)  # never leak into later tests, whatever happened


# ---- rendering (no processes) ----------------------------------------------------------------
def _location(conf: str, path: str) -> str:
    m = re.search(r"location " + re.escape(path) + r" \{(.*?)\n        \}", conf, re.S)
    assert m, f"no location {path}"
    return m.group(1)


def test_rendered_config_has_the_contract(tmp_path: Path) -> None:
    cfg = NginxConfig(upstreams=("127.0.0.1:9001", "10.1.2.3:8000"), prefix=tmp_path / "ng",
                      listen="127.0.0.1:9000", deadline_s=30, body_limit_bytes=8192)
    conf = render(cfg)
    assert "least_conn;" in conf and re.search(r"\n\s+keepalive \d+;", conf)
    assert "server 127.0.0.1:9001 max_fails=" in conf and "server 10.1.2.3:8000 max_fails=" in conf
    # each also a backup never marked failed: the upstream as a whole is never "down"
    assert "server 127.0.0.1:9001 backup max_fails=0;" in conf and "server 10.1.2.3:8000 backup max_fails=0;" in conf
    assert "proxy_next_upstream_tries 4;" in conf  # every instance as a primary and as a backup
    assert "client_max_body_size 8192;" in conf
    assert "proxy_read_timeout 35s;" in conf  # the service's deadline plus a margin
    assert "$http_x_request_id" in conf and "proxy_set_header X-Request-Id $chunlian_request_id;" in conf
    assert "location = /nginx-health" in conf
    assert re.search(r"proxy_next_upstream error timeout http_502 http_503;", conf)
    assert "non_idempotent" in _location(conf, "/v1/couplets")
    assert "non_idempotent" not in _location(conf, "/v1/jobs")
    assert len(re.findall(r"^\s*proxy_next_upstream [^;]*non_idempotent;", conf, re.M)) == 1
    # every file nginx writes is inside the prefix
    prefix = str((tmp_path / "ng").resolve())
    for directive in ("pid", "error_log", "client_body_temp_path", "proxy_temp_path",
                      "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path", "access_log"):
        m = re.search(rf"^\s*{directive} (\S+)", conf, re.M)
        assert m and m.group(1).startswith(prefix + "/"), (directive, m and m.group(1))
    assert "{{" not in conf


def test_renderer_refuses_drift_and_bad_parameters(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no value"):
        fill("a {{x}} b", {})
    with pytest.raises(ClusterError, match="does not use"):
        fill("a {{x}} b", {"x": 1, "y": 2})
    assert "{{upstream_servers}}" in template_text()
    with pytest.raises(ConfigError, match="HOST:PORT"):
        render(NginxConfig(upstreams=("nohost",), prefix=tmp_path))
    with pytest.raises(ConfigError, match="at least one"):
        render(NginxConfig(upstreams=(), prefix=tmp_path))


def test_nginx_accepts_the_rendered_config(tmp_path: Path) -> None:
    from chunlian.cluster.nginx import check_config, write

    binary = nginx_or_skip()
    cfg = NginxConfig(upstreams=("127.0.0.1:9001", "127.0.0.1:9002"), prefix=tmp_path / "ng",
                      listen=f"127.0.0.1:{free_port()}")
    write(cfg)
    check_config(binary, cfg)  # nginx -t; raises with nginx's message


# ---- the running cluster (in this order: the kill test removes an instance) ------------------
def test_nginx_health_and_request_id(cluster: Launched) -> None:
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        r = c.get("/nginx-health")
        assert r.status_code == 200 and r.json()["instances"] == 2
        assert "x-chunlian-instance" not in r.headers  # answered by nginx itself
        status = c.get("/nginx-status")
        assert status.status_code == 200 and "Active connections" in status.text
        r = c.get("/readyz", headers={"X-Request-Id": "itest-cluster-42"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "itest-cluster-42"
        assert r.headers["x-chunlian-instance"] in cluster.instance_ids
        r = c.get("/readyz")
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # nginx's $request_id
        big = c.post("/v1/couplets", content=b"{" + b" " * 2_000_000 + b"}",
                     headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    # nginx's own refusal, which no instance saw, is on the exporter's /metrics
    metrics_url = cluster.info["nginx"]["metrics_url"]
    assert metrics_url

    def counted() -> bool:
        text = httpx.get(metrics_url, timeout=10).text
        return "chunlian_nginx_up 1.0" in text and 'chunlian_nginx_responses_total{code="413"} 1.0' in text
    assert _wait_until(counted, 15), httpx.get(metrics_url, timeout=10).text


def test_requests_are_spread_over_both_instances(cluster: Launched) -> None:
    seen: Counter[str] = Counter()
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        for i in range(12):
            r = c.post("/v1/couplets", json={"upper": UPPERS[i % len(UPPERS)]}) if i % 2 else c.get("/readyz")
            assert r.status_code == 200, r.text
            seen[r.headers["x-chunlian-instance"]] += 1
    assert set(seen) == cluster.instance_ids, seen


def test_generated_through_one_is_a_hit_through_the_other(cluster: Launched) -> None:
    body = {"upper": "福满人间万户新", "seed": random.randrange(10**9)}  # a key no run used
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        first = c.post("/v1/couplets", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["cached"] is False
    served_by = first.headers["x-chunlian-instance"]
    (other,) = [i for i in cluster.info["instances"] if i["id"] != served_by]
    with httpx.Client(base_url=other["url"], timeout=30) as c:
        again = c.post("/v1/couplets", json=body)
    assert again.headers["x-chunlian-instance"] == other["id"]
    assert again.json()["cached"] is True  # the in-process cache is off: a Redis hit
    assert again.json()["lower"] == first.json()["lower"]
    assert again.json()["hengpi"] == first.json()["hengpi"]


@pytest.mark.skipif(not WITH_WORKERS, reason="this build has no jobs module (chunlian worker)")
def test_a_job_submitted_through_nginx_is_run_by_the_worker_and_seen_by_every_instance(
        cluster: Launched) -> None:
    assert len(cluster.info["workers"]) == 1 and cluster.info["broker_url"] == REDIS_URL
    # beside instances, the worker loads no model: its items go through nginx to their engines
    worker = cluster.info["workers"][0]
    assert worker["engine_url"] == cluster.url
    assert _environ(worker["pid"]).get("CHUNLIAN_WORKER_ENGINE_URL") == cluster.url
    for inst in cluster.info["instances"]:  # two model processes share the cores
        assert _environ(inst["pid"]).get("CHUNLIAN_OMP_SPIN") == "bounded"
    items = [{"upper": u, "seed": random.randrange(10**9)} for u in UPPERS[:3]]
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        r = c.post("/v1/jobs", json={"items": items})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    bodies: dict[str, dict[str, Any]] = {}

    def done_everywhere() -> bool:
        for inst in cluster.info["instances"]:  # each instance reads the shared job state
            got = httpx.get(f"{inst['url']}/v1/jobs/{job_id}", timeout=30)
            assert got.status_code == 200, got.text
            bodies[inst["id"]] = got.json()
        return all(b["status"] == "done" for b in bodies.values())

    assert _wait_until(done_everywhere, 180), bodies
    for body in bodies.values():
        assert body["progress"]["done"] == 3
        assert [e["upper"] for e in body["results"]] == list(UPPERS[:3])


def test_an_instance_killed_mid_stream_fails_no_request(cluster: Launched) -> None:
    victim = cluster.info["instances"][0]
    survivor = cluster.info["instances"][1]
    results: list[tuple[int, str | None, bool]] = []  # status, instance, sent after the kill
    from_victim = asyncio.Event()
    killed = False
    seeds = iter(range(random.randrange(10**9), 10**10))

    async def stream(c: httpx.AsyncClient, n: int) -> None:
        for i in range(n):
            # cache misses (fresh seeds) keep requests in flight on the instances
            body = {"upper": UPPERS[i % len(UPPERS)], "seed": next(seeds)}
            after = killed
            try:
                r = await c.post("/v1/couplets", json=body)
                results.append((r.status_code, r.headers.get("x-chunlian-instance"), after))
            except httpx.HTTPError as e:
                results.append((-1, repr(e), after))
            if results[-1][1] == victim["id"] and sum(1 for s in results if s[1] == victim["id"]) >= 3:
                from_victim.set()

    async def kill_when_victim_served() -> None:
        nonlocal killed
        await asyncio.wait_for(from_victim.wait(), timeout=240)
        os.kill(victim["pid"], signal.SIGKILL)
        killed = True

    async def main() -> None:
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60, limits=limits) as c:
            await asyncio.gather(*(stream(c, 12) for _ in range(6)), kill_when_victim_served())

    # a fresh thread: an earlier test in the session may have left this thread's loop running
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result()
    assert killed
    assert _wait_until(lambda: not _alive(victim["pid"]), 10)
    failures = [r for r in results if r[0] != 200]
    assert not failures, failures
    after_kill = [r for r in results if r[2]]
    assert after_kill and all(inst == survivor["id"] for _, inst, _ in after_kill)
    # and the cluster keeps answering through nginx while the victim is down (or warming up)
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        for _ in range(4):
            r = c.post("/v1/couplets", json={"upper": UPPERS[0]})
            assert r.status_code == 200, r.text
    # the launcher starts the victim again, on its port with its id, and nginx uses it again
    assert _wait_until(lambda: "instance-1 started again" in "".join(cluster.stderr), 30), "".join(cluster.stderr)
    assert _wait_until(lambda: http_status("127.0.0.1", victim["port"], "/readyz") == 200, READY_LIMIT_S)
    seen: set[str] = set()
    with httpx.Client(base_url=cluster.url, timeout=30) as c:
        def victim_serves() -> bool:  # once nginx's fail_timeout (5 s) for its refused connections ends
            r = c.post("/v1/couplets", json={"upper": UPPERS[len(seen) % len(UPPERS)]})
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-chunlian-instance"])
            return victim["id"] in seen
        assert _wait_until(victim_serves, 30), seen


def test_the_launcher_stops_everything_on_sigterm(cluster: Launched) -> None:
    pids = {cluster.info["nginx"]["pid"], *(i["pid"] for i in cluster.info["instances"]),
            *(w["pid"] for w in cluster.info["workers"])}
    pgids = set(cluster.info["pgids"])
    nginx_group = _in_groups({cluster.info["nginx"]["pid"]})
    assert len(nginx_group) >= 2  # master and at least one worker, all to be stopped
    cluster.proc.send_signal(signal.SIGTERM)
    assert cluster.proc.wait(timeout=90) == 0, "".join(cluster.stderr)
    assert "stopped" in "".join(cluster.stderr)
    assert [p for p in pids | set(nginx_group) if _alive(p)] == []
    assert _in_groups(pgids) == []
    assert _ours(cluster.marker, cluster.prefix) == []
    assert not Path(cluster.info["nginx"]["config"]).with_name("nginx.pid").exists()


# ---- a child dying during start-up --------------------------------------------------------------
def test_an_instance_dying_at_start_up_stops_everything(weights: Path, tmp_path: Path) -> None:
    nginx_or_skip()
    marker = uuid.uuid4().hex
    env = _env(marker, weights, CHUNLIAN_MODEL_PATH=str(tmp_path / "no-such-model.safetensors"))
    prefix = tmp_path / "prefix"
    proc = _launch(["--instances", "2", "--port", str(free_port()), "--redis-url", REDIS_URL,
                    "--prefix", str(prefix), "--ready-timeout-s", str(READY_LIMIT_S)], env)
    try:
        out, err = proc.communicate(timeout=READY_LIMIT_S + 60)
        leftovers = _ours(marker, prefix)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_leftovers(marker, set(), prefix)
    assert proc.returncode == 1, err
    assert re.search(r"instance-\d \(pid \d+\) exited with status", err), err
    assert "model weights not found" in err
    assert out == ""
    assert leftovers == []


def test_nginx_failing_to_bind_stops_everything_with_nginx_words(weights: Path, tmp_path: Path) -> None:
    nginx_or_skip()
    marker = uuid.uuid4().hex
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        prefix = tmp_path / "prefix"
        proc = _launch(["--instances", "1", "--port", str(port), "--redis-url", REDIS_URL,
                        "--prefix", str(prefix), "--ready-timeout-s", str(READY_LIMIT_S)],
                       _env(marker, weights))
        try:
            out, err = proc.communicate(timeout=READY_LIMIT_S + 60)
            leftovers = _ours(marker, prefix)
        finally:
            if proc.poll() is None:
                proc.kill()
            _kill_leftovers(marker, set(), prefix)
    assert proc.returncode == 1, err
    assert "nginx (pid" in err and "Address already in use" in err, err
    assert leftovers == []


def test_a_sigkilled_launcher_leaves_nothing_behind(weights: Path, tmp_path: Path) -> None:
    """The children get SIGTERM from the kernel when the launcher dies (PR_SET_PDEATHSIG)."""
    nginx_or_skip()
    marker = uuid.uuid4().hex
    prefix = tmp_path / "prefix"
    proc = _launch(["--instances", "2", "--port", str(free_port()), "--redis-url", REDIS_URL,
                    "--prefix", str(prefix), "--ready-timeout-s", str(READY_LIMIT_S)], _env(marker, weights))
    try:
        # every child spawned: nginx (spawned last) has written its pid file
        pid_file = prefix / "nginx" / "nginx.pid"
        def pid_written() -> bool:
            with contextlib.suppress(OSError):
                return pid_file.read_text().strip().isdigit()
            return False

        assert _wait_until(lambda: pid_written() or proc.poll() is not None, READY_LIMIT_S)
        assert proc.poll() is None
        master = int(pid_file.read_text())
        instances = lambda: [p for p in _marked(marker)  # noqa: E731
                             if b"chunlian.api" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert _wait_until(lambda: len(instances()) == 2, 30), _ours(marker, prefix)
        before = _ours(marker, prefix)
        assert master in before and len(before) >= 5  # launcher, 2 instances, nginx master + worker
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_until(lambda: _ours(marker, prefix) == [], 60), _ours(marker, prefix)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_leftovers(marker, set(), prefix)
