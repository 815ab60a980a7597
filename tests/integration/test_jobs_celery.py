"""Bulk jobs on real Celery workers and the real Redis (db 11), through real HTTP.

Workers are real processes (``chunlian worker`` with the test hooks of ``hooked_worker``)
started by the tests, each in its own process session so that a whole worker (main process and pool) can be SIGKILLed,
and always killed in ``finally``. The queue name is unique to this test run, and only this run's
keys are deleted from db 11, so a concurrent run is not disturbed.

Nothing here depends on timing for pass/fail: waits poll with generous bounds, and where a
test needs the worker to be at a given point (mid-chunk, for the kill and the cancel), a
test-only gate (``CHUNLIAN_TEST_GATE``: a Redis key) holds it there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from chunlian.config import load_settings
from chunlian.data.samples import sample_uppers
from chunlian.errors import InvalidInput
from chunlian.jobs.items import MAX_JOB_ITEMS
from chunlian.jobs.redis_store import job_keys
from chunlian.jobs.worker import MAX_TRIES
from chunlian.text import is_han, validate_upper
from tests.integration.hooked_worker import HANG_TEXT, POISON_TEXT
from tests.integration.live_server import LiveServer, model_path
from tests.unit.api_fakes import FakeEngine
from tests.unit.test_api_routes import assert_error

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REDIS_URL = "redis://127.0.0.1:6379/11"
QUEUE = f"chunlian-test-{uuid.uuid4().hex[:10]}"
GATE = f"{QUEUE}:gate"
TTL_S = 3600
ROOT = Path(__file__).resolve().parents[2]


def wait_until(pred: Callable[[], Any], limit_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {limit_s:g} s waiting for {what}"
        time.sleep(every_s)


def uppers(n: int) -> list[str]:
    pool = []
    for u in sample_uppers():
        try:
            pool.append(validate_upper(u))
        except InvalidInput:
            continue
    return [pool[i % len(pool)] for i in range(n)]


class Worker:
    """``chunlian worker`` in its own session; ``kill()`` SIGKILLs the whole group."""

    def __init__(self, weights: Path, log_dir: Path, **env: str) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNLIAN_")}
        self.env.update({
            "CHUNLIAN_BROKER_URL": REDIS_URL, "CHUNLIAN_JOB_QUEUE": QUEUE,
            "CHUNLIAN_TORCH_THREADS": "1", "CHUNLIAN_DEVICE": "cpu",
            "CHUNLIAN_MODEL_PATH": str(weights), "CHUNLIAN_MAX_BATCH_SIZE": "10",
            "CHUNLIAN_JOB_RESULT_TTL_S": str(TTL_S), "PYTHONPATH": str(ROOT),
        })
        self.env.update(env)
        self.log_path = log_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.hooked_worker", "worker", "--concurrency", "1",
             "--log-level", "INFO"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        )
        log.close()
        wait_until(lambda: " ready." in self.log() or self.proc.poll() is not None, 180, "the worker")
        assert self.proc.poll() is None, f"worker exited:\n{self.log()[-3000:]}"
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (main process and pool)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill()


@pytest.fixture(scope="module")
def rds() -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=5)
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    yield r
    keys = [k for pattern in (f"*{QUEUE}*", "chunlian:job:*") for k in r.scan_iter(pattern, count=1000)
            if QUEUE in k or k.split("{")[-1].split("}")[0] in JOB_IDS]
    if keys:
        r.delete(*keys)


JOB_IDS: set[str] = set()


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_path(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def make_api(rds: redis.Redis) -> Iterator[Callable[..., str]]:
    """A service in Celery mode (its engine a fake: the workers do the generating)."""
    servers: list[LiveServer] = []

    def make(**overrides: Any) -> str:
        base: dict[str, Any] = dict(
            broker_url=REDIS_URL, job_queue=QUEUE, job_result_ttl_s=TTL_S, warmup="",
            instance_id="itest-jobs", body_limit_bytes=2_000_000,
        )
        base.update(overrides)
        server = LiveServer(load_settings(**base), FakeEngine()).start()
        servers.append(server)
        server.wait_ready()
        return server.base_url

    try:
        yield make
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def api(make_api: Callable[..., str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=make_api(), timeout=60) as c:
        yield c


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path


def submit(client: httpx.Client, items: list[dict[str, Any]], quality: str = "fast") -> str:
    """A job; ``fast`` unless asked: these tests are about the jobs' machinery, which runs a
    quality item as any other (``test_a_quality_job_runs_on_a_worker`` runs one)."""
    r = client.post("/v1/jobs", json={"items": items, "quality": quality})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    JOB_IDS.add(job_id)
    return str(job_id)


def job(client: httpx.Client, job_id: str, **params: int) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{job_id}", params=params or {"limit": 0})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def finished(client: httpx.Client, job_id: str) -> dict[str, Any] | None:
    body = job(client, job_id)
    p = body["progress"]
    return body if p["done"] + p["failed"] + p["cancelled"] == p["total"] else None


def all_results(client: httpx.Client, job_id: str, total: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for offset in range(0, total, 1000):
        out += job(client, job_id, offset=offset, limit=1000)["results"]
    return out


def store_counts(rds: redis.Redis, job_id: str) -> tuple[dict[str, str], int, dict[int, int]]:
    meta, results, tries = job_keys(job_id)
    return rds.hgetall(meta), rds.hlen(results), {int(k): int(v) for k, v in rds.hgetall(tries).items()}


def run_worker(weights: Path, log_dir: Path, **env: str) -> Worker:
    return Worker(weights, log_dir, **env)


# ---- the tests ----------------------------------------------------------------------------------
def nice_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])  # field 19: nice


def test_500_items_complete_with_every_result(api: httpx.Client, rds: redis.Redis, weights: Path, log_dir: Path) -> None:
    lines = uppers(500)
    job_id = submit(api, [{"upper": u} for u in lines])
    assert job(api, job_id)["status"] in ("queued", "running")
    worker = Worker(weights, log_dir)
    try:
        worker.start()
        assert worker.proc is not None
        # bulk yields to interactive work: the worker and its pool run at worker_nice (10)
        assert nice_of(worker.proc.pid) == min(19, os.nice(0) + 10)
        body = wait_until(lambda: finished(api, job_id), 600, "the 500-item job", every_s=1.0)
    finally:
        worker.stop()
    assert body["status"] == "done"
    assert body["progress"] == {"done": 500, "failed": 0, "cancelled": 0, "total": 500}
    results = all_results(api, job_id, 500)
    assert [r["index"] for r in results] == list(range(500))
    assert all(r["status"] == "done" for r in results)
    assert [r["upper"] for r in results] == lines
    assert all(len(r["lower"]) == len(r["upper"]) and r["hengpi"] for r in results)
    meta, n_results, tries = store_counts(rds, job_id)
    assert n_results == 500 and meta["done"] == "500" and set(tries.values()) == {1}
    assert 0 < rds.ttl(job_keys(job_id)[1]) <= TTL_S


def test_a_quality_job_runs_on_a_worker(api: httpx.Client, weights: Path, log_dir: Path) -> None:
    lines = uppers(10)
    r = api.post("/v1/jobs", json={"items": [{"upper": u} for u in lines], "quality": True})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    JOB_IDS.add(job_id)
    worker = Worker(weights, log_dir)
    try:
        worker.start()
        body = wait_until(lambda: finished(api, job_id), 300, "the quality job", every_s=1.0)
        assert "loaded the quality mode" in worker.log()
    finally:
        worker.stop()
    assert body["progress"] == {"done": 10, "failed": 0, "cancelled": 0, "total": 10}
    results = all_results(api, job_id, 10)
    assert [r["upper"] for r in results] == lines
    for r in results:  # the quality mode's rules hold as the engine's do
        assert "@rev-" in r["model"] and len(r["lower"]) == len(r["upper"]) and r["hengpi"]
        assert not {c for c in r["upper"] if is_han(c)} & set(r["lower"])


def test_sigkilled_worker_mid_job_every_item_exactly_once(
    api: httpx.Client, rds: redis.Redis, weights: Path, log_dir: Path
) -> None:
    # Small limits so that the killed worker's unacknowledged chunk becomes visible again soon.
    env = {"CHUNLIAN_JOB_SOFT_TIME_LIMIT_S": "20", "CHUNLIAN_JOB_HARD_TIME_LIMIT_S": "25",
           "CHUNLIAN_JOB_VISIBILITY_TIMEOUT_S": "30", "CHUNLIAN_TEST_GATE": GATE}
    lines = uppers(200)
    rds.set(GATE, "1", ex=600)  # the worker stops before the 2nd sub-batch of the 1st chunk
    first = Worker(weights, log_dir, **env)
    second = Worker(weights, log_dir, **env)
    try:
        job_id = submit(api, [{"upper": u} for u in lines])
        first.start()
        wait_until(lambda: job(api, job_id)["progress"]["done"] >= 10, 300, "the first sub-batch")
        # items 10..19 have begun (one try counted) and are held at the gate: kill now
        wait_until(lambda: store_counts(rds, job_id)[2].get(10) == 1, 60, "the 2nd sub-batch to begin")
        first.kill()
        assert job(api, job_id)["progress"]["done"] == 10
        rds.delete(GATE)
        second.start()
        body = wait_until(lambda: finished(api, job_id), 600, "the job after the kill", every_s=1.0)
    finally:
        rds.delete(GATE)
        first.kill()
        second.stop()
    assert body["status"] == "done"
    assert body["progress"] == {"done": 200, "failed": 0, "cancelled": 0, "total": 200}
    results = all_results(api, job_id, 200)
    assert [r["index"] for r in results] == list(range(200))  # each index once
    assert [r["upper"] for r in results] == lines
    meta, n_results, tries = store_counts(rds, job_id)
    assert n_results == 200
    assert int(meta["done"]) + int(meta["failed"]) + int(meta["cancelled"]) == 200  # counted once
    # the redelivered chunk ran again exactly the items the killed worker had begun
    assert {i for i, n in tries.items() if n == 2} == set(range(10, 20))
    assert {i for i, n in tries.items() if n == 1} == set(range(200)) - set(range(10, 20))


def test_sigterm_drains_the_worker_in_celerys_way(
    api: httpx.Client, rds: redis.Redis, weights: Path, log_dir: Path
) -> None:
    """SIGTERM to the worker's main process (what an orchestrator sends to a container's
    PID 1) is Celery's warm shutdown: it takes no new chunk, finishes the one it runs, and
    exits 0; the chunks it never started stay queued for the next worker, so every item runs
    exactly once."""
    lines = uppers(100)  # two chunks of 50
    env = {"CHUNLIAN_TEST_DELAY_S": "0.4"}  # a chunk's 5 sub-batches take a few seconds
    first = Worker(weights, log_dir, **env)
    second = Worker(weights, log_dir)
    try:
        job_id = submit(api, [{"upper": u} for u in lines])
        first.start()
        wait_until(lambda: job(api, job_id)["progress"]["done"] >= 10, 300, "the first sub-batch")
        assert first.proc is not None
        t0 = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)  # the main process only, as `podman stop` does
        code = first.proc.wait(timeout=90)
        drain_s = time.monotonic() - t0
        done_at_exit = job(api, job_id)["progress"]["done"]
        second.start()
        body = wait_until(lambda: finished(api, job_id), 600, "the job after the drain", every_s=1.0)
    finally:
        first.kill()
        second.stop()
    assert code == 0, first.log()[-3000:]
    assert done_at_exit == 50  # the chunk in flight finished; the other was left queued
    assert "warm shutdown" in first.log().lower()
    assert body["progress"] == {"done": 100, "failed": 0, "cancelled": 0, "total": 100}
    _, n_results, tries = store_counts(rds, job_id)
    assert n_results == 100 and set(tries.values()) == {1}  # nothing ran twice
    print(f"\nworker drain: SIGTERM mid-chunk, the chunk's 50 items finished, exit 0 after {drain_s:.2f} s")


def test_poison_item_fails_alone_after_its_retries(
    api: httpx.Client, rds: redis.Redis, weights: Path, log_dir: Path
) -> None:
    lines = uppers(20)
    lines[7] = POISON_TEXT
    job_id = submit(api, [{"upper": u} for u in lines])
    worker = Worker(weights, log_dir, CHUNLIAN_TEST_POISON="1")
    try:
        worker.start()
        body = wait_until(lambda: finished(api, job_id), 300, "the job with a poison item")
    finally:
        worker.stop()
    assert body["status"] == "done"
    assert body["progress"] == {"done": 19, "failed": 1, "cancelled": 0, "total": 20}
    results = all_results(api, job_id, 20)
    bad = results[7]
    assert bad["status"] == "failed" and bad["error"]["code"] == "item_failed"
    assert f"after {MAX_TRIES} tries" in bad["error"]["message"] and "Poison" in bad["error"]["message"]
    assert all(r["status"] == "done" for i, r in enumerate(results) if i != 7)
    tries = store_counts(rds, job_id)[2]
    assert tries[7] == MAX_TRIES and all(tries[i] == 1 for i in range(20) if i != 7)
    assert "retry: Retry in 1s" in worker.log() and "retry: Retry in 2s" in worker.log()  # 2^n backoff


def test_task_over_its_hard_time_limit_is_killed_and_reported(
    make_api: Callable[..., str], rds: redis.Redis, weights: Path, log_dir: Path
) -> None:
    with httpx.Client(base_url=make_api(job_chunk_size=1), timeout=60) as client:
        lines = ["春回大地千山秀", HANG_TEXT, "天增岁月人增寿"]
        job_id = submit(client, [{"upper": u} for u in lines])
        worker = Worker(weights, log_dir, CHUNLIAN_TEST_HANG="1",
                        CHUNLIAN_JOB_SOFT_TIME_LIMIT_S="2", CHUNLIAN_JOB_HARD_TIME_LIMIT_S="4")
        try:
            worker.start()
            body = wait_until(lambda: finished(client, job_id), 300, "the job with a hanging item")
        finally:
            worker.stop()
        results = all_results(client, job_id, 3)
    assert body["progress"] == {"done": 2, "failed": 1, "cancelled": 0, "total": 3}
    assert [r["status"] for r in results] == ["done", "failed", "done"]
    err = results[1]["error"]
    assert err["code"] == "time_limit" and "hard time limit (4 s)" in err["message"]
    assert "Hard time limit (4" in worker.log()


def test_cancel_stops_pending_items(api: httpx.Client, rds: redis.Redis, weights: Path, log_dir: Path) -> None:
    lines = uppers(200)
    rds.set(GATE, "1", ex=600)
    worker = Worker(weights, log_dir, CHUNLIAN_TEST_GATE=GATE)
    try:
        job_id = submit(api, [{"upper": u} for u in lines])
        worker.start()
        wait_until(lambda: job(api, job_id)["progress"]["done"] >= 10, 300, "the first sub-batch")
        r = api.delete(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled"
        assert r.json()["progress"] == {"done": 10, "failed": 0, "cancelled": 190, "total": 200}
        rds.delete(GATE)
        # a job queued behind the cancelled one: once it is done, every chunk of the first was taken
        follow = submit(api, [{"upper": u} for u in lines[:3]])
        wait_until(lambda: finished(api, follow), 300, "the follow-up job")
    finally:
        rds.delete(GATE)
        worker.stop()
    body = job(api, job_id, limit=1000)
    assert body["status"] == "cancelled"
    assert body["progress"] == {"done": 10, "failed": 0, "cancelled": 190, "total": 200}
    assert [r["status"] for r in body["results"]] == ["done"] * 10 + ["cancelled"] * 190
    tries = store_counts(rds, job_id)[2]
    assert max(tries) < 20  # no item past the held sub-batch was ever given to the model
    assert job(api, follow)["status"] == "done"
    again = api.delete(f"/v1/jobs/{follow}")  # a finished job stays as it is
    assert again.status_code == 200 and again.json()["status"] == "done"


def _private_redis(port: int, data_dir: Path) -> None:
    subprocess.run(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes",
                    "--save", "", "--appendonly", "no", "--dir", str(data_dir),
                    "--logfile", str(data_dir / "redis.log")], check=True, capture_output=True, timeout=30)

    def up() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    wait_until(up, 30, "the private Redis")


def test_broker_restarted_mid_job_every_item_exactly_once(
    make_api: Callable[..., str], weights: Path, log_dir: Path, tmp_path: Path
) -> None:
    """A private Redis (its own port: the shared one is not touched) restarted with its data
    (SHUTDOWN SAVE) while a worker holds a chunk: the job still completes, each item once.
    (The in-flight chunk's message can be lost in the restart; the API sends a chunk again
    once it has been marked running for longer than the hard limit + 30 s.)"""
    port = free_socket_port()
    url = f"redis://127.0.0.1:{port}/0"
    _private_redis(port, tmp_path)
    private = redis.Redis(port=port, decode_responses=True)
    gate = f"{QUEUE}:restart-gate"
    limits = {"CHUNLIAN_JOB_SOFT_TIME_LIMIT_S": "8", "CHUNLIAN_JOB_HARD_TIME_LIMIT_S": "10",
              "CHUNLIAN_JOB_VISIBILITY_TIMEOUT_S": "20"}
    worker = Worker(weights, log_dir, CHUNLIAN_BROKER_URL=url, CHUNLIAN_TEST_GATE=gate, **limits)
    try:
        base = make_api(broker_url=url, job_soft_time_limit_s=8, job_hard_time_limit_s=10,
                        job_visibility_timeout_s=20)
        with httpx.Client(base_url=base, timeout=60) as client:
            lines = uppers(150)
            private.set(gate, "1")
            job_id = submit(client, [{"upper": u} for u in lines])
            worker.start()
            wait_until(lambda: job(client, job_id)["progress"]["done"] >= 10, 300, "the first sub-batch")
            private.delete(gate)
            private.shutdown(save=True)  # the worker is mid-chunk
            _private_redis(port, tmp_path)

            def done() -> dict[str, Any] | None:
                try:
                    return finished(client, job_id)
                except AssertionError:  # 503 while the broker is coming back
                    return None

            body = wait_until(done, 300, "the job after the broker restart", every_s=1.0)
            results = all_results(client, job_id, 150)
    finally:
        worker.stop()
        with contextlib.suppress(redis.RedisError):
            private.shutdown(nosave=True)
    assert body["progress"] == {"done": 150, "failed": 0, "cancelled": 0, "total": 150}
    assert [r["index"] for r in results] == list(range(150))
    assert [r["upper"] for r in results] == lines


def free_socket_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_on_an_instance_engine_over_http(rds: redis.Redis, weights: Path, log_dir: Path) -> None:
    """``chunlian worker --engine-url``: no model in the worker, items go to the instance's
    engine at bulk priority (here the instance's engine is the fake one: its tag proves it)."""
    engine = FakeEngine()
    settings = load_settings(broker_url=REDIS_URL, job_queue=QUEUE, job_result_ttl_s=TTL_S, warmup="",
                             instance_id="itest-jobs-http", max_batch_size=16)
    server = LiveServer(settings, engine).start()
    worker = Worker(weights, log_dir, CHUNLIAN_WORKER_ENGINE_URL=server.base_url,
                    CHUNLIAN_MAX_BATCH_SIZE="16", CHUNLIAN_BULK_MIN_SHARE="0.25")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            lines = uppers(30)
            job_id = submit(client, [{"upper": u} for u in lines])
            worker.start()
            body = wait_until(lambda: finished(client, job_id), 300, "the job via the engine URL")
            results = all_results(client, job_id, 30)
    finally:
        worker.stop()
        server.stop()
    assert body["progress"] == {"done": 30, "failed": 0, "cancelled": 0, "total": 30}
    assert [r["upper"] for r in results] == lines
    assert {r["model"] for r in results} == {FakeEngine.model_tag}
    assert len(engine.calls) == 30 and {c.priority for c in engine.calls} == {"bulk"}
    assert "loaded" not in worker.log() and f"sends items to {server.base_url}" in worker.log()
    # up to max_batch_size items a request, at bulk priority: the instance's scheduler paces
    # them beside interactive work (test_scheduler)
    assert "(16 at a time)" in worker.log()


BAD_BODIES: list[tuple[Any, str | None]] = [
    ({}, "items"),
    ({"items": []}, "items"),
    ({"items": "春回大地千山秀"}, "items"),
    ({"items": [{"upper": "春回大地千山秀"}] * (MAX_JOB_ITEMS + 1)}, "items"),
    ({"items": ["春回大地千山秀"]}, "items.0"),
    ({"items": [{"upper": "春回大地千山秀"}, {"upper": "hello"}]}, "items.1.upper"),
    ({"items": [{"upper": "春回大地千山秀", "style": "modern"}]}, "items.0.style"),
    ({"items": [{"heads": "李明", "length": 6}]}, "items.0.length"),
    ({"items": [{"upper": 7}]}, "items.0.upper"),
    ([{"upper": "春回大地千山秀"}], None),
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
def test_bad_job_bodies_get_422(api: httpx.Client, body: Any, field: str | None) -> None:
    assert_error(api.post("/v1/jobs", json=body), 422, "invalid_input", field)


def test_unparseable_body_and_bad_paging(api: httpx.Client) -> None:
    r = api.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_json")
    job_id = submit(api, [{"upper": "春回大地千山秀"}])
    assert_error(api.get(f"/v1/jobs/{job_id}", params={"limit": 5000}), 422, "invalid_input", "limit")
    assert_error(api.get(f"/v1/jobs/{job_id}", params={"offset": -1}), 422, "invalid_input", "offset")
    assert_error(api.get("/v1/jobs/no-such-job"), 404, "not_found", "job_id")
    assert_error(api.delete("/v1/jobs/no-such-job"), 404, "not_found", "job_id")
    api.delete(f"/v1/jobs/{job_id}")


def test_api_keys_guard_the_job_endpoints(make_api: Callable[..., str]) -> None:
    with httpx.Client(base_url=make_api(api_keys="alpha,beta"), timeout=30) as c:
        assert_error(c.post("/v1/jobs", json={"items": []}), 401, "unauthorized")
        assert_error(c.get("/v1/jobs/x", headers={"X-API-Key": "gamma"}), 401, "unauthorized")
        assert_error(c.delete("/v1/jobs/x"), 401, "unauthorized")
        r = c.post("/v1/jobs", json={"items": [{"upper": "春回大地千山秀"}]}, headers={"X-API-Key": "beta"})
        assert r.status_code == 202
        JOB_IDS.add(r.json()["job_id"])
        c.delete(f"/v1/jobs/{r.json()['job_id']}", headers={"X-API-Key": "alpha"})
        assert c.get("/healthz").status_code == 200  # other endpoints stay open
