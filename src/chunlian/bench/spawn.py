"""Child processes of the benchmarks: start one, poll it until it answers, stop it (SIGTERM,
then SIGKILL). ``chunlian bench`` and the scripts in ``benchmarks/`` start every server and
worker they measure through here; free ports come from ``cluster.procs.free_port``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Spawned:
    """One started child; with ``own_session`` it leads its own process group, and ``stop``
    signals the whole group (a server's engine processes, a Celery worker's pool)."""

    proc: subprocess.Popen[bytes]
    log_path: Path | None
    own_session: bool
    url: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_session:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM; SIGKILL if it has not exited after ``grace_s``. Idempotent."""
        if self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None, log_path: Path | None = None,
          own_session: bool = False, cwd: Path | None = None) -> Spawned:
    """Start ``argv`` with its output in ``log_path`` (None: discarded)."""
    out = log_path.open("wb") if log_path is not None else None
    try:
        proc = subprocess.Popen(list(argv), env=None if env is None else dict(env), cwd=cwd,
                                stdout=out if out is not None else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=own_session)
    finally:
        if out is not None:
            out.close()  # the child holds its own copy
    return Spawned(proc, log_path, own_session)


def wait_until_ok(
    proc: subprocess.Popen[bytes], url: str, path: str, limit_s: float, what: str,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``url + path`` until it answers 200; raise ``RuntimeError`` naming ``what`` if
    ``proc`` exits first or ``limit_s`` passes (with ``detail()`` appended, e.g. a log tail)."""
    deadline = time.monotonic() + limit_s
    with httpx.Client(base_url=url, timeout=5.0) as c:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}{detail()}")
            try:
                if c.get(path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} was not ready in {limit_s:.0f} s{detail()}")
            time.sleep(0.1)


@contextmanager
def serving(argv: Sequence[str], port: int, *, what: str, ready_path: str = "/readyz",
            limit_s: float = 180.0, env: Mapping[str, str] | None = None,
            log_path: Path | None = None, temp_log: bool = False, own_session: bool = False,
            grace_s: float = 20.0, cwd: Path | None = None) -> Iterator[Spawned]:
    """Start an HTTP server (``argv``, listening on loopback ``port``), wait until
    ``ready_path`` answers 200, yield it, then stop it (``Spawned.stop``). Its output goes to
    ``log_path``, or with ``temp_log`` to a temporary file removed afterwards; a failed start
    raises ``RuntimeError`` with the log's tail."""
    if temp_log and log_path is None:
        fd, name = tempfile.mkstemp(prefix="chunlian-bench-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    child = spawn(argv, env=env, log_path=log_path, own_session=own_session, cwd=cwd)
    child.url = f"http://127.0.0.1:{port}"
    try:
        tail = (lambda: f":\n{child.log_tail()}") if log_path is not None else (lambda: "")
        wait_until_ok(child.proc, child.url, ready_path, limit_s, what, tail)
        yield child
    finally:
        child.stop(grace_s)
        if temp_log and log_path is not None:
            log_path.unlink(missing_ok=True)
