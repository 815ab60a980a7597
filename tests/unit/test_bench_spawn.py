"""Spawn-and-wait (``chunlian.bench.spawn``): a server is polled until ready and stopped with
SIGTERM, then SIGKILL; a child in its own session is stopped with its whole group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from chunlian.bench.spawn import serving, spawn
from chunlian.cluster.procs import free_port

# an HTTP server that answers 200 on /readyz; with "stubborn" it ignores SIGTERM
SERVER = """
import http.server, signal, sys
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_serving_waits_until_ready_then_stops_with_sigterm() -> None:
    port = free_port()
    with serving([sys.executable, "-c", SERVER, str(port), "polite"], port, what="the test server",
                 limit_s=30, temp_log=True) as srv:
        assert srv.url == f"http://127.0.0.1:{port}" and srv.proc.poll() is None
        log = srv.log_path
        assert log is not None and "listening" in log.read_text()
    assert srv.proc.returncode == -15  # SIGTERM was enough
    assert not log.exists()  # the temporary log is removed


def test_serving_kills_what_ignores_sigterm() -> None:
    port = free_port()
    t0 = time.monotonic()
    with serving([sys.executable, "-c", SERVER, str(port), "stubborn"], port, what="the test server",
                 limit_s=30, grace_s=0.5) as srv:
        pass
    assert srv.proc.returncode == -9 and time.monotonic() - t0 < 20


def test_a_failed_start_says_so_with_the_log(tmp_path: Path) -> None:
    code = "import sys; print('no model here'); sys.exit(3)"
    with pytest.raises(RuntimeError, match=r"(?s)the service exited with 3.*no model here"), \
            serving([sys.executable, "-c", code], free_port(), what="the service", limit_s=30,
                    log_path=tmp_path / "log"):
        pass


def test_stop_takes_the_whole_session() -> None:
    """A worker's pool (here a grandchild) goes with it."""
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print('started', flush=True)\ntime.sleep(60)\n")
    child = spawn([sys.executable, "-c", code], own_session=True)
    deadline = time.monotonic() + 30
    while not psutil.Process(child.pid).children():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = psutil.Process(child.pid).children()[0]
    child.stop(grace_s=5)
    assert child.proc.returncode == -15
    deadline = time.monotonic() + 5
    while _running(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived its session's stop"
        time.sleep(0.05)


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE  # exited; its new parent may not reap it
    except psutil.NoSuchProcess:
        return False
