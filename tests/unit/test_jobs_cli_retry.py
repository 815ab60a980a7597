"""``chunlian jobs``' HTTP client waits out 429 and 503 (``Retry-After``) and sends the request
again, a bounded number of times: a per-client rate in front of the service slows a long job's
polling and paging instead of failing it. Against a real loopback HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from chunlian import retry
from chunlian.jobs import cli


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[int, dict[str, str]]], list[bytes]]]:
    """A server answering each request with the next (status, headers) of its script."""
    script: list[tuple[int, dict[str, str]]] = []
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            bodies.append(self.rfile.read(n))
            status, headers = script.pop(0) if script else (200, {})
            payload = json.dumps({"ok": status == 200}).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script, bodies
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_refusals_are_waited_out_and_the_request_sent_again(server: tuple[str, list, list]) -> None:
    url, script, bodies = server
    waits: list[float] = []
    script += [(429, {"Retry-After": "2"}), (503, {}), (200, {})]
    with httpx.Client(base_url=url, transport=cli._polite_transport(sleep=waits.append)) as c:
        r = c.post("/v1/jobs", json={"items": [{"upper": "春回大地千山秀"}]})
    assert r.status_code == 200 and waits == [2.0, 2.0]  # Retry-After, then back-off 2^1
    assert len(bodies) == 3 and len(set(bodies)) == 1  # the same body each time


def test_retries_are_bounded_and_the_last_refusal_is_returned(server: tuple[str, list, list]) -> None:
    url, script, _ = server
    waits: list[float] = []
    script += [(429, {"Retry-After": "600"})] * (cli.MAX_RETRIES + 1)
    with httpx.Client(base_url=url, transport=cli._polite_transport(sleep=waits.append)) as c:
        r = c.get("/v1/jobs/x")
    assert r.status_code == 429 and waits == [retry.MAX_RETRY_WAIT_S] * cli.MAX_RETRIES
    script.clear()
    script += [(404, {}), (500, {})]
    with httpx.Client(base_url=url, transport=cli._polite_transport(sleep=waits.append)) as c:
        assert c.get("/v1/jobs/x").status_code == 404 and c.get("/v1/jobs/x").status_code == 500  # not retried


@pytest.mark.parametrize(("value", "attempt", "wait"), [("3", 0, 3.0), ("0", 0, 0.1), (None, 3, 8.0),
                                                        ("soon", 1, 2.0), ("1e9", 0, 30.0)])
def test_retry_after(value: str | None, attempt: int, wait: float) -> None:
    assert retry.retry_after_s(value, attempt) == wait


@pytest.mark.parametrize("command", [["list"], ["status", "abc"], ["results", "abc"], ["cancel", "abc"]])
def test_an_unreachable_service_is_one_line_not_a_traceback(command: list[str]) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "chunlian.cli", "jobs", *command, "--url", f"http://127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [f"chunlian jobs: error: no answer from http://127.0.0.1:{port}: "
                                             "ConnectError: [Errno 111] Connection refused"]
