"""nginx's side of the story on ``/metrics``: what the front refused before any instance saw it.

The instances count what reaches them; nginx's own answers (the per-client rate's 429, its
413 and 503) never do. nginx OSS has no per-status counters, so this exporter reads the two
things it does have:

* the access log in the ``chunlian`` format (``chunlian.cluster.nginx``'s template), followed
  like ``tail -F`` (from its end at start-up; a rotated or truncated file is read again from
  its start), into ``chunlian_nginx_responses_total{code}`` and
  ``chunlian_nginx_limit_req_total{state}`` (``$limit_req_status``: ``PASSED``, ``REJECTED``,
  ``REJECTED_DRY_RUN``, ...): the share of requests the per-client rate refuses, which is
  what tells an operator the rate is too tight (a carrier's NAT) or an abuser is being held;
* ``stub_status`` (``/nginx-status``, loopback only), read at each scrape, into
  ``chunlian_nginx_up``, ``chunlian_nginx_connections{state}`` and
  ``chunlian_nginx_requests_total``.

``chunlian cluster`` starts one beside its nginx; with an nginx of your own:
``python -m chunlian.cluster.exporter --access-log /var/log/nginx/chunlian.log
--status-url http://127.0.0.1:8000/nginx-status --listen 127.0.0.1:9113``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import threading
import urllib.request
from collections import Counter as TallyCounter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# '$remote_addr [$time_local] "$request" $status ... limit=$limit_req_status': nginx escapes a
# quote inside $request as \x22, so the request is the first quoted field. Parsed with str
# methods: a regex with an optional tail backtracks, and costs several times the whole count
# (docs/performance.md).
_LIMIT = " limit="
_STUB = re.compile(r"Active connections:\s*(\d+).*?\n\s*(\d+)\s+(\d+)\s+(\d+).*?Reading:\s*(\d+)\s*"
                   r"Writing:\s*(\d+)\s*Waiting:\s*(\d+)", re.S)


def parse_line(line: str) -> tuple[str, str | None] | None:
    """(status code, ``$limit_req_status`` or None when the line has none or it is ``-``),
    or None for a line not in the ``chunlian`` format."""
    first = line.find('"')
    end = line.find('"', first + 1) if first > 0 else -1
    code = line[end + 2 : end + 5]
    if end < 0 or line[end + 1 : end + 2] != " " or not (code.isdigit() and len(code) == 3):
        return None
    if line[end + 5 : end + 6] not in ("", " ", "\n"):
        return None
    at = line.rfind(_LIMIT, end)
    limit = line[at + len(_LIMIT) :].split(None, 1)[0] if at >= 0 and line[at + len(_LIMIT) :].strip() else None
    return code, (None if limit in (None, "-") else limit)


def parse_stub_status(text: str) -> dict[str, int]:
    """``stub_status``'s page as numbers (``ValueError`` when it is not one)."""
    m = _STUB.search(text)
    if m is None:
        raise ValueError(f"not an nginx stub_status page: {text[:80]!r}")
    active, accepts, handled, requests, reading, writing, waiting = (int(g) for g in m.groups())
    return {"active": active, "accepts": accepts, "handled": handled, "requests": requests,
            "reading": reading, "writing": writing, "waiting": waiting}


class LogFollower:
    """Complete lines appended to ``path`` since the last ``lines()`` call, across rotation
    (a new file under the name) and truncation; a missing file yields nothing until it exists."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._inode: int | None = None
        self._partial = b""
        self._from_start = False  # True once the file was missing at a poll before the first open

    def _reopen(self, stat: os.stat_result, at_end: bool) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self.path.open("rb")
        self._inode = stat.st_ino
        self._partial = b""
        if at_end:
            self._file.seek(0, os.SEEK_END)

    def lines(self) -> Iterator[str]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            if self._file is None:
                self._from_start = True  # created after we started: every line of it is new
            return
        if self._file is None:
            self._reopen(stat, at_end=not self._from_start)
        elif stat.st_ino != self._inode or stat.st_size < self._file.tell():
            yield from self._drain()  # what the old file still held, then the new one from its start
            self._reopen(stat, at_end=False)
        yield from self._drain()

    def _drain(self) -> Iterator[str]:
        assert self._file is not None
        data = self._partial + self._file.read()
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            yield raw.decode("utf-8", "replace")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class StubStatusCollector(Collector):
    """``stub_status`` read at scrape time (loopback, bounded by ``timeout_s``)."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily("chunlian_nginx_up", "1 when nginx's stub_status answered this scrape")
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as r:  # noqa: S310 - operator's URL
                stub = parse_stub_status(r.read().decode("ascii", "replace"))
        except (OSError, ValueError):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        conns = GaugeMetricFamily("chunlian_nginx_connections", "nginx's client connections by state",
                                  labels=["state"])
        for state in ("active", "reading", "writing", "waiting"):
            conns.add_metric([state], stub[state])
        yield conns
        yield CounterMetricFamily("chunlian_nginx_requests", "client requests nginx has handled",
                                  value=stub["requests"])


class AccessLogCounters:
    """The access log's lines as counters (registered in ``registry``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter("chunlian_nginx_responses", "responses nginx sent, by status code",
                                 ["code"], registry=registry)
        self.limit_req = Counter("chunlian_nginx_limit_req", "couplet and job requests by the per-client "
                                 "rate's verdict ($limit_req_status)", ["state"], registry=registry)
        self.unparsed = Counter("chunlian_nginx_access_log_unparsed", "access-log lines not in the "
                                "chunlian format", registry=registry)

    def count(self, lines: Iterable[str]) -> None:
        """Count ``lines``; tallied first, so a poll's thousand lines are a few ``inc`` calls
        (a labelled ``inc`` costs more than parsing the line)."""
        codes: TallyCounter[str] = TallyCounter()
        limits: TallyCounter[str] = TallyCounter()
        unparsed = 0
        for line in lines:
            if not line.strip():
                continue
            parsed = parse_line(line)
            if parsed is None:
                unparsed += 1
                continue
            codes[parsed[0]] += 1
            if parsed[1] is not None:
                limits[parsed[1]] += 1
        for code, n in codes.items():
            self.responses.labels(code).inc(n)
        for state, n in limits.items():
            self.limit_req.labels(state).inc(n)
        if unparsed:
            self.unparsed.inc(unparsed)


def run(access_log: Path | None, status_url: str | None, host: str, port: int,
        poll_s: float = 1.0, stop: threading.Event | None = None,
        registry: CollectorRegistry | None = None) -> None:
    """Serve the metrics on ``host:port`` and follow ``access_log`` until ``stop`` is set."""
    stop = stop or threading.Event()
    registry = registry or CollectorRegistry()
    counters = AccessLogCounters(registry)
    if status_url:
        registry.register(StubStatusCollector(status_url))
    server, thread = start_http_server(port, addr=host, registry=registry)
    follower = LogFollower(access_log) if access_log else None
    try:
        while True:
            if follower is not None:
                counters.count(follower.lines())
            if stop.wait(poll_s):
                break
    finally:
        if follower is not None:
            follower.close()
        server.shutdown()
        thread.join(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chunlian.cluster.exporter", description=__doc__.split("\n\n")[0])
    ap.add_argument("--access-log", type=Path, help="nginx's access log in the chunlian format")
    ap.add_argument("--status-url", help="nginx's stub_status, e.g. http://127.0.0.1:8000/nginx-status")
    ap.add_argument("--listen", default="127.0.0.1:9113", help="host:port to serve /metrics on")
    ap.add_argument("--poll-s", type=float, default=1.0, help="how often the log is read (s)")
    args = ap.parse_args(argv)
    host, _, port_text = args.listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536 or args.poll_s <= 0:
        ap.error(f"expected --listen HOST:PORT and --poll-s > 0, got {args.listen!r} and {args.poll_s}")
    if args.access_log is None and args.status_url is None:
        ap.error("give --access-log, --status-url or both")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(args.access_log, args.status_url, host.strip("[]"), int(port_text), args.poll_s, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
