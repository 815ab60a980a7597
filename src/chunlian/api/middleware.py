"""The service's one ASGI middleware (plain ASGI: no per-request task or body copy).

For every HTTP request it:
* takes the client's ``X-Request-Id`` when it is sane (1-128 characters of
  ``[A-Za-z0-9._:-]``), else makes one; both it and ``X-Chunlian-Instance`` go on every
  response, errors included;
* rejects headers over ``max_header_bytes`` (431) and bodies over ``body_limit`` (413):
  at once when ``Content-Length`` says so, else as soon as the streamed body passes it,
  without reading the rest;
* while the instance drains (``api.drain``): refuses new ``/v1/`` requests with 503
  ``shutting_down`` and ``Retry-After``, closes connections after each answer, and counts
  the requests it is still answering;
* turns an unexpected exception into a 500 in the shared error shape (the trace goes to
  the log, never to the client);
* records request count and latency by endpoint (the route's path template) and writes
  one access-log line carrying the request id.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunlian.api.drain import Drain
from chunlian.api.errors import BodyTooLarge, error_body, json_bytes

access_log = logging.getLogger("chunlian.access")
log = logging.getLogger("chunlian.api")

_SANE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
DEFAULT_MAX_HEADER_BYTES = 16 * 1024

RequestObserver = Callable[[str, int, float], None]  # (endpoint, status, seconds)


def endpoint_label(scope: Scope) -> str:
    """The route's path template, so metrics never carry per-request values."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    if str(scope.get("path", "")).startswith("/static/"):
        return "/static"
    return "unmatched"


class ServiceMiddleware:
    """Request ids, instance header, size limits, error containment, metrics, access log."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        instance_id: str,
        body_limit: int,
        observe: RequestObserver | None = None,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        refusal_headers: Callable[[Scope], list[tuple[bytes, bytes]]] | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.app = app
        self.instance = instance_id.encode("latin-1", "replace")
        self.body_limit = body_limit
        self.observe = observe
        self.max_header_bytes = max_header_bytes
        self.refusal_headers = refusal_headers  # CORS headers for its own refusals (api.cors)
        self.drain = drain or Drain()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = self._request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["arrival_s"] = start  # deadlines count from here (api.service)
        extra = [(b"x-request-id", request_id.encode("ascii")), (b"x-chunlian-instance", self.instance)]
        status = 500
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        async def reply_error(code_status: int, code: str, message: str,
                              headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
            body = json_bytes(error_body(code, message))
            await send_with_headers({
                "type": "http.response.start", "status": code_status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers,
                            *(self.refusal_headers(scope) if self.refusal_headers else ())],
            })
            await send_with_headers({"type": "http.response.body", "body": body})

        drain = self.drain
        counted = False
        try:
            if drain.draining:
                extra.append((b"connection", b"close"))  # keep-alive connections wind down
            refusal = self._refuse_early(scope)
            if refusal is not None:
                await reply_error(*refusal)
            elif drain.refuses(str(scope.get("path", ""))):
                await reply_error(503, "shutting_down", "this instance is shutting down; retry shortly "
                                  "(another instance answers)", ((b"retry-after", b"1"),))
            else:
                drain.in_flight += 1
                counted = True
                await self.app(scope, self._limited(receive), send_with_headers)
        except BodyTooLarge:
            if not started:
                await reply_error(413, "body_too_large", f"request body exceeds {self.body_limit} bytes")
        except Exception:
            log.exception("unhandled error serving %s %s rid=%s", scope.get("method"),
                          scope.get("path"), request_id)
            if not started:
                await reply_error(500, "internal", "the server failed to answer this request")
        finally:
            if counted:
                drain.in_flight -= 1
            elapsed = time.perf_counter() - start
            endpoint = endpoint_label(scope)
            if self.observe is not None:
                self.observe(endpoint, status, elapsed)
            if access_log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                access_log.info(
                    '%s "%s %s HTTP/%s" %d %.1fms rid=%s',
                    client[0] if client else "-", scope.get("method"), scope.get("path"),
                    scope.get("http_version", "1.1"), status, elapsed * 1000.0, request_id,
                )

    @staticmethod
    def _request_id(scope: Scope) -> str:
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                text = bytes(value).decode("latin-1")
                if _SANE_ID.fullmatch(text):
                    return text
                break
        return os.urandom(16).hex()  # 128 random bits as uuid4().hex gives, at a seventh of its cost

    def _refuse_early(self, scope: Scope) -> tuple[int, str, str] | None:
        """A refusal decided from the headers alone, before any body is read."""
        headers = scope.get("headers", ())
        if sum(len(k) + len(v) for k, v in headers) > self.max_header_bytes:
            return 431, "headers_too_large", f"request headers exceed {self.max_header_bytes} bytes"
        for name, value in headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return 400, "bad_request", "invalid Content-Length"
                if declared > self.body_limit:
                    return 413, "body_too_large", f"request body exceeds {self.body_limit} bytes"
        return None

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that raises ``BodyTooLarge`` once the body passes the limit."""
        seen = 0
        limit = self.body_limit

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        return limited_receive
