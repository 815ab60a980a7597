"""The nginx exporter: access-log lines and stub_status as Prometheus metrics, the log
followed across rotation, served over real loopback HTTP."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from chunlian.cluster.exporter import (
    AccessLogCounters,
    LogFollower,
    main,
    parse_line,
    parse_stub_status,
    run,
)
from chunlian.cluster.procs import free_port

LINE = ('127.0.0.1 [03/Dec/2026:15:20:01 +0000] "POST /v1/couplets HTTP/1.1" {code} 160 rt=0.000 urt=- '
        'upstream=- ustatus=- rid=abc limit={limit}')
STUB = ("Active connections: 7 \nserver accepts handled requests\n 120 120 4567 \n"
        "Reading: 1 Writing: 2 Waiting: 4 \n")


@pytest.mark.parametrize(("line", "parsed"), [
    (LINE.format(code=429, limit="REJECTED"), ("429", "REJECTED")),
    (LINE.format(code=200, limit="PASSED"), ("200", "PASSED")),
    (LINE.format(code=200, limit="-"), ("200", None)),  # a location without limit_req
    (LINE.format(code=200, limit="REJECTED_DRY_RUN"), ("200", "REJECTED_DRY_RUN")),
    ('::1 [03/Dec/2026:15:20:01 +0000] "GET /x?q=\\x22a b\\x22 HTTP/1.1" 404 9', ("404", None)),  # no limit field
    ("garbage", None),
    ('127.0.0.1 [t] "GET / HTTP/1.1" abc 0', None),
])
def test_parse_line(line: str, parsed: tuple[str, str | None] | None) -> None:
    assert parse_line(line) == parsed


def test_parse_stub_status() -> None:
    assert parse_stub_status(STUB) == {"active": 7, "accepts": 120, "handled": 120, "requests": 4567,
                                       "reading": 1, "writing": 2, "waiting": 4}
    with pytest.raises(ValueError, match="stub_status"):
        parse_stub_status("<html>hello</html>")


def test_the_follower_reads_new_complete_lines_across_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    follower = LogFollower(log)
    log.write_text("old 1\nold 2\n")
    assert list(follower.lines()) == []  # from the end at start: history is not counted
    with log.open("a") as f:
        f.write("new 1\nnew 2 half")
    assert list(follower.lines()) == ["new 1"]  # the half line waits for its end
    with log.open("a") as f:
        f.write(" done\n")
    assert list(follower.lines()) == ["new 2 half done"]
    with log.open("a") as f:
        f.write("last of the old file\n")
    log.rename(tmp_path / "access.log.1")  # logrotate: the old file moves, nginx reopens a new one
    log.write_text("first of the new file\n")
    assert list(follower.lines()) == ["last of the old file", "first of the new file"]
    log.write_text("")  # truncated in place (copytruncate)
    with log.open("a") as f:
        f.write("after truncation\n")
    assert list(follower.lines()) == ["after truncation"]
    follower.close()
    late = LogFollower(tmp_path / "later.log")
    assert list(late.lines()) == []
    (tmp_path / "later.log").write_text("written before the next poll\n")
    assert list(late.lines()) == ["written before the next poll"]  # a file born after the start: read whole
    late.close()


def test_counters_by_code_and_limit_state() -> None:
    registry = CollectorRegistry()
    counters = AccessLogCounters(registry)
    counters.count([LINE.format(code=429, limit="REJECTED")] * 3 + [LINE.format(code=200, limit="PASSED"),
                                                                  LINE.format(code=200, limit="-"), "junk", ""])
    counters.count(iter([LINE.format(code=429, limit="REJECTED")]))  # a second poll adds to the first
    value = registry.get_sample_value
    assert value("chunlian_nginx_responses_total", {"code": "429"}) == 4
    assert value("chunlian_nginx_responses_total", {"code": "200"}) == 2
    assert value("chunlian_nginx_limit_req_total", {"state": "REJECTED"}) == 4
    assert value("chunlian_nginx_limit_req_total", {"state": "PASSED"}) == 1
    assert value("chunlian_nginx_access_log_unparsed_total") == 1


@pytest.fixture
def stub_server() -> Iterator[tuple[str, list[int]]]:
    """A loopback stub_status page; answers 500 while ``broken[0]`` is set."""
    broken = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = STUB.encode()
            self.send_response(500 if broken[0] else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/nginx-status", broken
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_exporter_serves_the_logs_counts_and_nginx_status(tmp_path: Path,
                                                              stub_server: tuple[str, list[int]]) -> None:
    status_url, broken = stub_server
    log = tmp_path / "access.log"
    log.write_text(LINE.format(code=429, limit="REJECTED") + "\n")  # before start: not counted
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(log, status_url, "127.0.0.1", port, 0.05, stop), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the exporter never answered"
                time.sleep(0.05)
        with log.open("a") as f:
            f.write("\n".join([LINE.format(code=429, limit="REJECTED")] * 2 + [LINE.format(code=200, limit="PASSED")]) + "\n")
        deadline = time.monotonic() + 10
        while 'chunlian_nginx_limit_req_total{state="PASSED"} 1.0' not in (text := httpx.get(url, timeout=2).text):
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        assert 'chunlian_nginx_limit_req_total{state="REJECTED"} 2.0' in text
        assert 'chunlian_nginx_responses_total{code="429"} 2.0' in text
        assert "chunlian_nginx_up 1.0" in text and "chunlian_nginx_requests_total 4567.0" in text
        assert 'chunlian_nginx_connections{state="waiting"} 4.0' in text
        broken[0] = 1  # nginx gone: up 0, and no stale connection figures
        text = httpx.get(url, timeout=2).text
        assert "chunlian_nginx_up 0.0" in text and "chunlian_nginx_connections{" not in text
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize("argv", [[], ["--status-url", "http://127.0.0.1:1/x", "--listen", "nohost"],
                                  ["--access-log", "a.log", "--poll-s", "0"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
