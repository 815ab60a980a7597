"""The processes the scenarios drive: a service child process, an in-process service whose
engine a test can park, and the local Redis (stopped and restarted by some scenarios).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.reliability.harness.common import (
    CLUSTER_REDIS_DB,
    HOST,
    JOBS_REDIS_DB,
    PR_SET_PDEATHSIG,
    REDIS_PORT,
    REDIS_START,
    rss_kb,
)

# ---- services ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _child_setup() -> None:  # pragma: no cover - runs in the child
    """In a service child: die with the parent, and allow as many files as the hard limit."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    with contextlib.suppress(Exception):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class ServiceProcess:
    """``python -m chunlian.api`` in a child process on a free loopback port; its stderr and
    stdout go to a file (``log_text()``). Inherited ``CHUNLIAN_*`` variables are dropped: the
    service runs exactly ``settings`` (lower-case setting names) over quiet defaults."""

    DEFAULTS: dict[str, object] = {
        "host": HOST, "device": "cpu", "torch_threads": 1, "warmup": "", "log_level": "WARNING",
    }

    def __init__(self, settings: Mapping[str, object], name: str = "svc") -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.settings = {**self.DEFAULTS, **settings, "port": self.port}
        fd, log_name = tempfile.mkstemp(prefix=f"chunlian-rel-{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_name)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CHUNLIAN_")}
        env.update({f"CHUNLIAN_{k.upper()}": str(v) for k, v in self.settings.items() if v is not None})
        return env

    def start(self, ready_limit_s: float = 240.0) -> ServiceProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chunlian.api"], env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_child_setup,  # noqa: PLW1509 - no threads of ours run Python in the child
            )
        try:
            self.wait_ready(ready_limit_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, limit_s: float = 240.0) -> None:
        deadline = time.monotonic() + limit_s
        with httpx.Client(base_url=self.url, timeout=5.0) as c:
            while True:
                if self.proc is None or self.proc.poll() is not None:
                    raise RuntimeError(f"the service exited:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("/readyz").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the service was not ready in {limit_s:.0f} s:\n{self.log_tail()}")
                time.sleep(0.2)

    def rss_kb(self) -> int | None:
        return rss_kb(self.pid)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def kill(self) -> None:
        """SIGKILL (an instance crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM (graceful), SIGKILL after 20 s; the log file is kept until ``cleanup``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cleanup(self) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServiceProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class Hold:
    """An engine step listener that, when armed, parks the engine thread after its next step
    until ``open()``: the state of the queue is then fixed while a test acts on it."""

    def __init__(self) -> None:
        self.armed = False
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, report: Any) -> None:
        if self.armed:
            self.held.set()
            self.release.wait(120)

    def arm(self) -> None:
        self.held.clear()
        self.release.clear()
        self.armed = True

    def open(self) -> None:
        self.armed = False
        self.release.set()


class InProcessService:
    """The real app and engine under uvicorn in a thread of this process (the integration
    tests' ``LiveServer``), with a ``Hold`` on the engine (for scenarios that need the engine
    parked at a known point)."""

    def __init__(self, settings: Mapping[str, object]) -> None:
        from chunlian.config import load_settings
        from chunlian.engine.config import EngineConfig
        from chunlian.engine.engine import Engine
        from tests.integration.live_server import LiveServer

        base: dict[str, object] = {"device": "cpu", "torch_threads": 1, "warmup": ()}
        self.settings = load_settings(**{**base, **settings})
        self.engine = Engine.from_config(EngineConfig.from_settings(self.settings))
        self.hold = Hold()
        self.engine.add_step_listener(self.hold)
        self.live = LiveServer(self.settings, engine=self.engine)
        self.app, self.port, self.url = self.live.app, self.live.port, self.live.base_url

    def start(self, ready_limit_s: float = 240.0) -> InProcessService:
        self.live.start(ready_limit_s)
        self.live.wait_ready(ready_limit_s)
        return self

    def stop(self) -> None:
        self.hold.open()
        self.live.stop()

    def __enter__(self) -> InProcessService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- Redis -----------------------------------------------------------------------------------------


def redis_pings(port: int = REDIS_PORT) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def wait_for(pred: Callable[[], bool], limit_s: float, what: str, every_s: float = 0.1) -> None:
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def redis_run_id(port: int = REDIS_PORT) -> str | None:
    """The running Redis server's ``run_id`` (new at every start), None when it does not answer."""
    import redis

    try:
        info = redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1).info("server")
    except redis.RedisError:
        return None
    return str(info.get("run_id"))


def stop_redis(port: int = REDIS_PORT, save: bool = False) -> None:
    """Shut Redis down (``SHUTDOWN NOSAVE``, or ``SAVE`` to restart it with its data) and wait
    until it is gone, or until it is already another server: other test sessions on this
    machine start Redis again as soon as they find it down."""
    before = redis_run_id(port)
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "save" if save else "nosave"],
                   capture_output=True, timeout=60)
    wait_for(lambda: redis_run_id(port) != before, 30, "redis to stop")


def start_redis(port: int = REDIS_PORT) -> None:
    """Start the loopback Redis when it does not answer (the CI command line), and wait."""
    if not redis_pings(port):
        subprocess.run(REDIS_START, capture_output=True, timeout=30, check=False)
    wait_for(lambda: redis_pings(port), 30, "redis to answer")


def flush_db(db: int) -> None:
    """Empty Redis db ``db``: only the runner's own (8 and 9); db 12 is shared, never flushed."""
    import redis

    assert db in (JOBS_REDIS_DB, CLUSTER_REDIS_DB)
    r = redis.Redis(host=HOST, port=REDIS_PORT, db=db, socket_timeout=5)
    try:
        r.flushdb()
    finally:
        r.close()
