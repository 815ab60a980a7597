"""Shared pieces of the reliability scenarios: constants, ``Outcome``, a raw HTTP/1.1 client,
checks on replies, ``/metrics`` and memory readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from chunlian.bench.promtext import Samples, parse_metrics

HOST = "127.0.0.1"
REDIS_PORT = 6379
REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", str(REDIS_PORT),
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
]
SECURITY_REDIS_DB = 12
JOBS_REDIS_DB = 8  # the runner's own (emptied before and after); tests elsewhere use 10-15
CLUSTER_REDIS_DB = 9  # the runner's own (emptied before and after)
LEAK_MARKERS = ("Traceback", "site-packages", "/work/", ".py", 'File "', "/usr/lib/python")
ERROR_KEYS = {"code", "message", "field"}
PR_SET_PDEATHSIG = 1
HAN_RE = re.compile(r"[\u3400-\u9fff\U00020000-\U0002ffff]")

# Long Chinese lines (the engine stays busy longest on these) and a hot set for cache hits.
HOT_LINES = ("春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海")


def upper_lines() -> list[str]:
    """The 400 real upper lines shipped with the package."""
    from chunlian.data.samples import sample_uppers

    return sample_uppers()


# ---- outcome -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one scenario did and which promises it saw broken (``problems``)."""

    scenario: str
    load: str = ""
    sent: int = 0
    answered: int = 0  # 2xx
    rejected: int = 0  # a clear refusal: 4xx in the error shape, 429, or 504 after the deadline
    failed: int = 0  # 5xx (but 504), transport errors, malformed or leaking answers
    lost: int = 0  # requests without any answer, job items missing or duplicated
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    _problem_count: int = 0

    @property
    def ok(self) -> bool:
        return self.skipped is None and not self.problems and self.lost == 0

    def problem(self, message: str) -> None:
        """Record a broken promise (the first 25 are kept word for word)."""
        self._problem_count += 1
        if len(self.problems) < 25:
            self.problems.append(message)
        elif len(self.problems) == 25:
            self.problems.append("... (more problems left out)")

    def note(self, message: str) -> None:
        self.notes.append(message)

    def count(self, kind: str, status: str) -> None:
        """Count one request: ``kind`` is answered, rejected or failed."""
        self.sent += 1
        self.statuses[status] += 1
        if kind == "answered":
            self.answered += 1
        elif kind == "rejected":
            self.rejected += 1
        else:
            self.failed += 1

    def merge(self, other: Outcome) -> None:
        """Add ``other``'s counts and problems to this one."""
        self.sent += other.sent
        self.answered += other.answered
        self.rejected += other.rejected
        self.failed += other.failed
        self.lost += other.lost
        self.statuses.update(other.statuses)
        for p in other.problems:
            self.problem(p)
        self.notes.extend(other.notes)

    def summary(self) -> str:
        """One paragraph for an assertion message."""
        head = (f"{self.scenario}: sent {self.sent}, answered {self.answered}, rejected {self.rejected}, "
                f"failed {self.failed}, lost {self.lost}; statuses {dict(self.statuses)}")
        parts = [head, *(f"problem: {p}" for p in self.problems), *(f"note: {n}" for n in self.notes)]
        return "\n".join(parts)


# ---- raw HTTP/1.1 over asyncio streams ------------------------------------------------------------


class ProtocolError(Exception):
    """The server's bytes were not an HTTP/1.1 response."""


@dataclass
class Reply:
    """One HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes
    latency_s: float = 0.0

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class RawConn:
    """A keep-alive HTTP/1.1 connection: exact bytes out, plain parsing in (lets a test send
    what no client library would: invalid UTF-8, a body that never ends, a half request)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def open(self) -> bool:
        return self.writer is not None and not self.writer.is_closing()

    async def connect(self, timeout_s: float = 10.0) -> RawConn:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=1 << 20), timeout_s
        )
        return self

    async def send(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)
        await self.writer.drain()

    def head(self, method: str, path: str, headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
             length: int | None = None) -> bytes:
        """The request line and headers (``length``: a Content-Length header)."""
        items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in items]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(
        self, method: str, path: str, body: bytes | None = None,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (), timeout_s: float = 60.0,
    ) -> Reply:
        if not self.open or (self.reader is not None and self.reader.at_eof()):
            self.abort()  # the server closed an idle keep-alive connection: a new one, as clients do
            await self.connect()
        t0 = time.perf_counter()
        data = self.head(method, path, headers, None if body is None else len(body)) + (body or b"")
        await self.send(data)
        reply = await self.read_reply(timeout_s)
        reply.latency_s = time.perf_counter() - t0
        return reply

    async def read_reply(self, timeout_s: float = 60.0) -> Reply:
        return await asyncio.wait_for(self._read_reply(), timeout_s)

    async def _read_reply(self) -> Reply:
        assert self.reader is not None
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            raise ProtocolError(f"connection closed before a response ({len(e.partial)} bytes)") from None
        lines = head.decode("latin-1").split("\r\n")
        m = re.fullmatch(r"HTTP/1\.[01] (\d{3})(?: .*)?", lines[0])
        if not m:
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                body += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        else:
            body = await self.reader.read()
            headers.setdefault("connection", "close")
        if headers.get("connection", "").lower() == "close":
            self.abort()
        return Reply(int(m.group(1)), headers, body)

    def abort(self) -> None:
        """Drop the connection at once (no graceful close)."""
        if self.writer is not None:
            self.writer.transport.abort()
        self.writer = None
        self.reader = None

    async def close(self) -> None:
        if self.writer is not None:
            w = self.writer
            self.writer = None
            w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.wait_closed(), 2.0)


def json_body(obj: Any) -> bytes:
    """Compact UTF-8 JSON (lone surrogates escaped, as any JSON encoder does)."""
    return json.dumps(obj, separators=(",", ":")).encode()


JSON_HEADERS = {"Content-Type": "application/json"}


# ---- checks on replies ----------------------------------------------------------------------------


def leaks(text: str, sent: str = "") -> list[str]:
    """Internal markers in ``text`` that the request itself did not carry."""
    return [m for m in LEAK_MARKERS if m in text and m not in sent]


def error_shape_problem(reply: Reply, sent: bytes | str = b"", *, allow_protocol_400: bool = False) -> str | None:
    """Why ``reply`` (an error) is not a clear error in the shared shape; None when it is."""
    sent_text = sent if isinstance(sent, str) else sent.decode("utf-8", "replace")
    found = leaks(reply.text, sent_text)
    if found:
        return f"{reply.status} body leaks {found}: {reply.text[:200]!r}"
    if allow_protocol_400 and reply.status == 400 and not reply.headers.get("content-type", "").startswith("application/json"):
        return None  # uvicorn refusing bytes that are not HTTP at all, before the app runs
    if not reply.headers.get("content-type", "").startswith("application/json"):
        return f"{reply.status} with content-type {reply.headers.get('content-type')!r}: {reply.text[:120]!r}"
    try:
        body = reply.json()
    except ValueError:
        return f"{reply.status} body is not JSON: {reply.text[:120]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(body) != {"error"} or set(err) != ERROR_KEYS:
        return f"{reply.status} body not in the error shape: {reply.text[:200]!r}"
    if not isinstance(err["code"], str) or not err["code"] or not isinstance(err["message"], str) or not err["message"]:
        return f"{reply.status} error without code or message: {reply.text[:200]!r}"
    if err["field"] is not None and not isinstance(err["field"], str):
        return f"{reply.status} error field is not a string: {reply.text[:200]!r}"
    return None


def judge_hostile(out: Outcome, reply: Reply, sent: bytes | str, what: str, *,
                  allow_protocol_400: bool = False) -> None:
    """Count a reply to hostile input: 2xx answered, clear 4xx rejected, anything else failed."""
    status = str(reply.status)
    if reply.status == 504 and error_shape_problem(reply, sent) is None and reply.json()["error"]["code"] == "deadline_exceeded":
        out.count("rejected", status)  # the deadline the request set (timeout_ms) passed: documented
        return
    if reply.status >= 500:
        out.count("failed", status)
        out.problem(f"{what}: {reply.status} {reply.text[:200]!r}")
        return
    if reply.status >= 400:
        why = error_shape_problem(reply, sent, allow_protocol_400=allow_protocol_400)
        if why is None:
            out.count("rejected", status)
        else:
            out.count("failed", status)
            out.problem(f"{what}: {why}")
        return
    sent_text = sent if isinstance(sent, str) else sent.decode("utf-8", "replace")
    found = leaks(reply.text, sent_text)
    if found:
        out.count("failed", status)
        out.problem(f"{what}: {reply.status} leaks {found}")
    else:
        out.count("answered", status)


# ---- /metrics and memory --------------------------------------------------------------------------

def scrape(url: str, timeout_s: float = 30.0) -> Samples:
    return parse_metrics(httpx.get(url + "/metrics", timeout=timeout_s).text)


async def ascrape(url: str, timeout_s: float = 30.0) -> Samples:
    async with httpx.AsyncClient(timeout=timeout_s) as c:
        return parse_metrics((await c.get(url + "/metrics")).text)


def server_errors(samples: Samples) -> float:
    """HTTP answers with a 5xx status other than 504 (the deadline answer)."""
    return sum(v for labels, v in samples.get("chunlian_http_requests_total", ())
               if labels.get("status", "").startswith("5") and labels.get("status") != "504")


def rss_kb(pid: int) -> int | None:
    """The resident set (VmRSS) of ``pid`` in kB (None once the process is gone)."""
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.Error:
        return None


def tree_rss_kb(pid: int) -> int | None:
    """VmRSS of ``pid`` and its descendants, summed, in kB (None once ``pid`` is gone): an
    instance is a process tree when its engines run in child processes (``engine.replicas``),
    and a leak in an engine process counts as the instance's."""
    own = rss_kb(pid)
    if own is None:
        return None
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    return own + sum(rss_kb(k.pid) or 0 for k in kids)


def raise_fd_limit(want: int) -> int:
    """Raise this process's soft open-files limit towards ``want`` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft
