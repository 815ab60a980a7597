"""Scenario 3: Celery worker killed and broker restarted mid-job (package docstring).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.reliability.harness.common import HOST, JOBS_REDIS_DB, REDIS_PORT, Outcome, upper_lines
from tests.reliability.harness.services import (
    ServiceProcess,
    _child_setup,
    flush_db,
    start_redis,
    stop_redis,
    wait_for,
)

# ---- 3. worker faults ----------------------------------------------------------------------------

STALL_S = 30 + 25 + 20  # visibility timeout + hard time limit + slack: a lost chunk never comes back
WORKER_READY = " ready."


def jobs_available() -> str | None:
    """None when this build has Celery jobs and a ``chunlian worker`` command, else why not."""
    import importlib.util

    mods = ("chunlian.jobs.celery_app", "chunlian.jobs.tasks", "chunlian.jobs.store",
            "chunlian.jobs.redis_store", "chunlian.jobs.cli")
    for mod in mods:
        if importlib.util.find_spec(mod) is None:
            return f"this build has no {mod} (bulk jobs, issue 5)"
    return None


def cluster_available() -> str | None:
    """None when this build has the nginx launcher and nginx is installed, else why not."""
    import importlib.util

    if importlib.util.find_spec("chunlian.cluster.launcher") is None:
        return "this build has no chunlian.cluster.launcher (scale-out, issue 6)"
    if not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)):
        return "nginx is not installed (scripts/install-nginx.sh)"
    return None


class WorkerProcess:
    """``python -m chunlian.cli worker`` in its own session (SIGKILL takes the whole group)."""

    def __init__(self, env: Mapping[str, str], name: str) -> None:
        self.env = dict(env)
        fd, log_name = tempfile.mkstemp(prefix=f"chunlian-rel-{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_name)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, limit_s: float = 240.0) -> WorkerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chunlian.cli", "worker", "--concurrency", "1", "--log-level", "INFO"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_child_setup,  # noqa: PLW1509
            )
        wait_for(lambda: WORKER_READY in self.log() or self.proc is None or self.proc.poll() is not None,
                 limit_s, "the worker to be ready", every_s=0.25)
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited:\n{self.log()[-2000:]}")
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.proc is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # pool processes left behind
        self.log_path.unlink(missing_ok=True)


def _job_env(settings: Mapping[str, object]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CHUNLIAN_")}
    env.update({f"CHUNLIAN_{k.upper()}": str(v) for k, v in settings.items() if v is not None})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _job_items(n: int) -> list[dict[str, Any]]:
    from chunlian.errors import InvalidInput
    from chunlian.text import validate_upper

    pool = []
    for u in upper_lines():
        with contextlib.suppress(InvalidInput):
            pool.append(validate_upper(u))
    return [{"upper": pool[i % len(pool)], "seed": i} for i in range(n)]  # seeded: each item distinct


def _check_job(out: Outcome, api: httpx.Client, job_id: str, items: list[dict[str, Any]], key: str | None) -> None:
    """Every item exactly once: one result per index, in order, each done, counters agree."""
    headers = {"X-API-Key": key} if key else {}
    results: list[dict[str, Any]] = []
    for offset in range(0, len(items), 1000):
        r = api.get(f"/v1/jobs/{job_id}", params={"offset": offset, "limit": 1000}, headers=headers)
        r.raise_for_status()
        results += r.json()["results"] or []
    state = api.get(f"/v1/jobs/{job_id}", params={"limit": 0}, headers=headers).json()
    indices = [r.get("index") for r in results if r.get("status") != "pending"]
    seen = Counter(indices)
    missing = [i for i in range(len(items)) if seen[i] == 0]  # no result, or still pending
    dup = [i for i, n in seen.items() if n > 1]
    not_done = [r for r in results if r.get("status") not in ("done", "pending")]
    wrong = [r["index"] for r in results if r.get("status") == "done" and r.get("upper") != items[r["index"]]["upper"]]
    out.lost += len(missing) + len(dup)
    out.answered += sum(1 for r in results if r.get("status") == "done")
    out.failed += len(not_done)
    out.sent += len(items)
    if missing:
        out.problem(f"{len(missing)} items never got a result (still pending; first {missing[:5]})")
    if dup:
        out.problem(f"{len(dup)} items have more than one result (first {dup[:5]})")
    if not_done:
        out.problem(f"{len(not_done)} items not done: {not_done[:3]}")
    if wrong:
        out.problem(f"{len(wrong)} results belong to another item (first {wrong[:5]})")
    prog = state.get("progress", {})
    if prog.get("done") != len(items) or state.get("status") != "done":
        out.problem(f"job state {state.get('status')} progress {prog}")


def _job_tries(job_id: str, db: int) -> Counter[int]:
    import redis

    from chunlian.jobs.redis_store import job_keys

    r = redis.Redis(host=HOST, port=REDIS_PORT, db=db, socket_timeout=5, decode_responses=True)
    try:
        return Counter(int(v) for v in r.hgetall(job_keys(job_id)[2]).values())
    finally:
        r.close()


def _wait_job(api: httpx.Client, job_id: str, key: str | None, pred: Callable[[dict[str, Any]], bool],
              limit_s: float, what: str, errors: Counter[str]) -> dict[str, Any]:
    """Poll the job until ``pred(state)``; API errors while polling (the broker being down)
    are counted, not fatal."""
    deadline = time.monotonic() + limit_s
    headers = {"X-API-Key": key} if key else {}
    while True:
        try:
            r = api.get(f"/v1/jobs/{job_id}", params={"limit": 0}, headers=headers)
            if r.status_code == 200:
                state: dict[str, Any] = r.json()
                if pred(state):
                    return state
            else:
                errors[str(r.status_code)] += 1
        except httpx.HTTPError as e:
            errors[type(e).__name__] += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s:.0f} s waiting for {what}")
        time.sleep(0.5)


class Stalled(Exception):
    """A job made no progress for longer than any redelivery could take."""


def _wait_finished(api: httpx.Client, job_id: str, limit_s: float, stall_s: float, errors: Counter[str]) -> dict[str, Any]:
    """Poll until the job finishes; raise ``Stalled`` when no item finished for ``stall_s``
    (longer than the visibility timeout plus the hard time limit: nothing is coming back)."""
    deadline = time.monotonic() + limit_s
    last, last_change = -1, time.monotonic()
    while True:
        state = _wait_job(api, job_id, None, lambda s: True, 60, "the job state", errors)
        if state["status"] in ("done", "failed", "cancelled"):
            return state
        p = state["progress"]
        moved = p["done"] + p["failed"] + p["cancelled"]
        if moved != last:
            last, last_change = moved, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            raise Stalled(f"no progress for {stall_s:.0f} s at {p}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not finish within {limit_s:.0f} s ({p})")
        time.sleep(1.0)


def worker_fault(*, items: int = 2000, kill_at: float = 0.25, job_limit_s: float = 240.0,
                 broker_restart: bool = True, model_path: str | Path | None = None) -> list[Outcome]:
    """A 2,000-item job: its worker SIGKILLed once a quarter is done and another started;
    then a second job with the broker (Redis) restarted mid-job (``SHUTDOWN SAVE``: a
    restart, not a wipe). Every item must come back exactly once."""
    outs = [Outcome("3a. worker SIGKILLed mid-job", f"{items}-item job, worker killed at {kill_at:.0%}, another started")]
    if broker_restart:
        outs.append(Outcome("3b. broker restarted mid-job", f"{items}-item job, Redis restarted at {kill_at:.0%}"))
    why = jobs_available()
    if why:
        for o in outs:
            o.skipped = why
        return outs
    import redis

    queue = f"chunlian-rel-{uuid.uuid4().hex[:8]}"
    broker = f"redis://{HOST}:{REDIS_PORT}/{JOBS_REDIS_DB}"
    common: dict[str, object] = {
        "broker_url": broker, "job_queue": queue, "job_soft_time_limit_s": 20, "job_hard_time_limit_s": 25,
        "job_visibility_timeout_s": 30, "device": "cpu", "torch_threads": 1, "model_path": model_path,
        "max_batch_size": 32, "job_chunk_size": 50,
    }
    flush_db(JOBS_REDIS_DB)
    svc = ServiceProcess({**common, "log_level": "WARNING"}, "jobs-api")
    workers: list[WorkerProcess] = []

    def new_worker(name: str) -> WorkerProcess:
        w = WorkerProcess(_job_env({**common, "instance_id": name}), name)
        workers.append(w)
        return w.start()

    try:
        svc.start()
        with httpx.Client(base_url=svc.url, timeout=60) as api:
            # -- 3a: SIGKILL a worker mid-job -----------------------------------------------------------
            out = outs[0]
            t0 = time.monotonic()
            errors: Counter[str] = Counter()
            job_items = _job_items(items)
            r = api.post("/v1/jobs", json={"items": job_items})
            r.raise_for_status()
            job_id = r.json()["job_id"]
            first = new_worker("rel-worker-1")
            _wait_job(api, job_id, None, lambda s: s["progress"]["done"] >= items * kill_at, job_limit_s,
                      "a quarter of the job", errors)
            first.kill()
            done_at_kill = _wait_job(api, job_id, None, lambda s: True, 30, "the job state", errors)["progress"]["done"]
            new_worker("rel-worker-2")
            try:
                _wait_finished(api, job_id, job_limit_s, STALL_S, errors)
            except (Stalled, TimeoutError) as e:
                out.problem(f"after the kill: {e}")
            _check_job(out, api, job_id, job_items, None)
            tries = _job_tries(job_id, JOBS_REDIS_DB)
            out.note(f"{done_at_kill} items done when the worker was killed; items run twice (begun by the killed "
                     f"worker, result recorded once): {sum(1 for t in tries.elements() if t > 1)}")
            out.seconds = time.monotonic() - t0
            # -- 3b: restart the broker mid-job ----------------------------------------------------------
            if broker_restart:
                out = outs[1]
                t0 = time.monotonic()
                errors = Counter()
                job_items = _job_items(items)
                for k, it in enumerate(job_items):
                    it["seed"] = items + k
                r = api.post("/v1/jobs", json={"items": job_items})
                r.raise_for_status()
                job_id = r.json()["job_id"]
                _wait_job(api, job_id, None, lambda s: s["progress"]["done"] >= items * kill_at, job_limit_s,
                          "a quarter of the second job", errors)
                dump = Path("/var/lib/redis/dump.rdb")
                had_dump = dump.exists()
                try:
                    stop_redis(save=True)
                finally:
                    start_redis()
                    if not had_dump:
                        dump.unlink(missing_ok=True)  # loaded already; later restarts start empty again
                try:
                    _wait_finished(api, job_id, job_limit_s, STALL_S, errors)
                except (Stalled, TimeoutError) as e:
                    out.problem(f"after the broker restart: {e}")
                _check_job(out, api, job_id, job_items, None)
                tries = _job_tries(job_id, JOBS_REDIS_DB)
                out.note(f"API errors while the broker was down: {dict(errors) or 'none'}; items run twice: "
                         f"{sum(1 for t in tries.elements() if t > 1)}")
                out.seconds = time.monotonic() - t0
    except (TimeoutError, RuntimeError, httpx.HTTPError, redis.RedisError) as e:
        for o in outs:
            if o.sent == 0 and o.skipped is None:
                o.problem(f"did not complete: {e}")
                o.lost = max(o.lost, items)  # unproven: counted as lost
    finally:
        for w in workers:
            w.stop()
        svc.cleanup()
        with contextlib.suppress(redis.RedisError):
            flush_db(JOBS_REDIS_DB)
    return outs
