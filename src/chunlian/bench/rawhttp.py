"""The load tools' HTTP clients: a lean keep-alive connection on asyncio streams
(``RawConnection``, the one raw client of ``chunlian bench`` and ``benchmarks/``) and an httpx
one (``post_httpx``); both answer ``POST`` with (status, cached)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from chunlian.bench.plan import ENDPOINT

# what a broken or refused connection raises (besides TimeoutError)
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)
# what ``RawConnection.request`` raises: a timeout or one of those
EXCHANGE_ERRORS: tuple[type[Exception], ...] = (TimeoutError, *TRANSPORT_ERRORS)


def parse_answer(status: int, body: bytes) -> tuple[str, bool | None]:
    """(status as text, the answer's ``cached`` field when it is a 200 with a JSON body)."""
    if status != 200:
        return str(status), None
    try:
        cached = bool(json.loads(body).get("cached"))
    except (ValueError, AttributeError):
        return "bad_json", None
    return "200", cached


async def post_httpx(client: httpx.AsyncClient, body: bytes) -> tuple[str, bool | None]:
    try:
        r = await client.post(ENDPOINT, content=body, headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        return "timeout", None
    except httpx.TransportError as e:
        return f"transport:{type(e).__name__}", None
    return parse_answer(r.status_code, r.content)


class RawConnection:
    """One keep-alive HTTP/1.1 connection for ``POST`` of JSON bodies, on asyncio streams.

    A load generator must cost the host far less than the server it measures; a general
    client (httpx) spends milliseconds of CPU per request at high concurrency, this a few
    tens of microseconds. Plain ``http://`` only; reconnects after any error, and before
    reusing a connection idle for ``IDLE_REUSE_S`` (uvicorn closes idle ones after 5 s).
    """

    IDLE_REUSE_S = 2.0

    def __init__(self, host: str, port: int, timeout_s: float, source_host: str | None = None) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.source = (source_host, 0) if source_host else None  # the client's own address
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_used = 0.0

    async def post(self, path: str, body: bytes) -> tuple[str, bool | None]:
        # the load generator's hot path: ``request`` inlined (one coroutine less a request)
        try:
            async with asyncio.timeout(self.timeout_s):
                status, _headers, data = await self._exchange(path, body, b"POST")
        except TimeoutError:
            self.close()
            return "timeout", None
        except TRANSPORT_ERRORS as e:
            self.close()
            return f"transport:{type(e).__name__}", None
        return parse_answer(status, data)

    async def get(self, path: str) -> tuple[int, bytes]:
        """``GET path``: (status, body); -1 and the error's name on a timeout or transport error."""
        try:
            status, _headers, data = await self.request(b"GET", path)
        except EXCHANGE_ERRORS as e:
            return -1, type(e).__name__.encode()
        return status, data

    async def request(self, method: bytes, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """One exchange: (status, headers with lower-case names, body). Raises ``TimeoutError``
        after ``timeout_s`` or one of ``TRANSPORT_ERRORS``, closing the connection either way."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._exchange(path, body, method)
        except EXCHANGE_ERRORS:
            self.close()
            raise

    async def _exchange(self, path: str, body: bytes, method: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is not None and time.monotonic() - self.last_used > self.IDLE_REUSE_S:
            self.close()  # the server may be closing it (keep-alive timeout): don't race it
        reused = self.writer is not None
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, local_addr=self.source)
        reader, writer = self.reader, self.writer
        writer.write(method + b" " + path.encode() + b" HTTP/1.1\r\n" + self._head
                     + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            if not reused or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                raise
            # a kept-alive connection the server closed before answering: the request was
            # not read; send it once more on a new connection
            self.close()
            return await self._exchange(path, body, method)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            data = await _read_chunked(reader)
        else:
            data = await reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            self.close()
        self.last_used = time.monotonic()
        return status, headers, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()
