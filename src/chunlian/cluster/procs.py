"""Child-process plumbing of the cluster launcher: free ports, HTTP probes, death with the
parent (``PR_SET_PDEATHSIG``) and ``Child``, one started process leading its own group
(``spawn``)."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from chunlian.cluster.nginx import ClusterError

PR_SET_PDEATHSIG = 1


def quiet(_: str) -> None:
    """A progress reporter that says nothing (the launcher's default)."""
    return None


def free_port(host: str = "127.0.0.1", avoid: Sequence[int] = ()) -> int:
    """A TCP port that is free on ``host`` right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
    raise ClusterError("could not find a free port")


def http_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """The status of ``GET path``, or None when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def die_with_parent_of(parent: int) -> Callable[[], None]:
    """For the child before exec: SIGTERM when the launching thread dies; and if the
    launcher already died between fork and here (no signal will come), exit at once."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass
class Child:
    """One started process (the leader of its own process group)."""

    role: str  # "instance", "worker", "nginx" or "exporter"
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    port: int | None = None
    instance_id: str | None = None
    ready: bool = False
    reported_exit: bool = False
    cmd: list[str] = field(default_factory=list)  # how it was started, to start it again
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0  # how many times this role-and-name was started again

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)  # start_new_session: the pgid is the pid


def spawn(role: str, name: str, cmd: list[str], env: Mapping[str, str], log_path: Path) -> Child:
    """Start ``cmd`` leading a new process group, its output appended to ``log_path``; it
    gets SIGTERM when the calling thread dies (``die_with_parent_of``)."""
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed by whoever stops the child
    try:
        proc = subprocess.Popen(
            cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            preexec_fn=die_with_parent_of(os.getpid()),  # noqa: PLW1509 - prctl + getppid only
        )
    except OSError as e:
        log_file.close()
        raise ClusterError(f"could not start {name} ({cmd[0]}): {e}") from None
    return Child(role, name, proc, log_path, log_file, cmd=list(cmd), env=dict(env))
