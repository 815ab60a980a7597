"""The cache-hit fast path for ``POST /v1/couplets``, in front of the router.

On New Year's Eve most requests repeat a hot line and are cache hits, so their cost is the
web framework's: routing, dependency solving, pydantic and the response class took about
half of a hit's CPU time. ``CacheHitFastPath`` (pure ASGI, inside ``ServiceMiddleware``, so
request ids, size limits, metrics and the access log still apply) reads the body, and when
it is a plain, valid request (the fields of ``CoupletIn`` with their exact types, no
``regenerate``, ``n`` = 1) whose answer is cached, sends that answer itself. Anything else
-- a miss, a bad body, an unusual field, a non-JSON content type, the service not ready --
goes on to the router with the body replayed, so every answer and every error is exactly
the route's. Both paths build the cache key with ``cache_key`` from the same
``CoupletRequest`` (``validate_upper`` normalises the text in both).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunlian.api.errors import json_bytes
from chunlian.api.routes import CACHE_CHECKED, couplet_json
from chunlian.api.runtime import Runtime
from chunlian.api.schemas import MAX_RAW_TEXT, MAX_SEED
from chunlian.api.service import Answer
from chunlian.errors import InvalidInput
from chunlian.model.styles import STYLES
from chunlian.text import validate_upper
from chunlian.types import CoupletRequest, DecodeParams

PATH = "/v1/couplets"
_ROUTE = SimpleNamespace(path=PATH)  # the metrics' endpoint label, as the router would set it
_FIELDS = frozenset({"upper", "style", "n", "seed", "regenerate", "timeout_ms"})


def _int(v: Any) -> bool:
    return type(v) is int  # bool is not a number here, as in the strict schema


def plain_request(body: bytes) -> CoupletRequest | None:
    """The request ``body`` asks for, when it is a plain valid one the cache can answer;
    None sends it the long way (which also produces every error)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # the route answers 422 for these
        return None
    if type(data) is not dict or not data.keys() <= _FIELDS:
        return None
    upper, style = data.get("upper"), data.get("style", "traditional")
    n, seed, timeout_ms = data.get("n", 1), data.get("seed"), data.get("timeout_ms")
    if type(upper) is not str or len(upper) > MAX_RAW_TEXT or style not in STYLES:
        return None
    if not _int(n) or n != 1 or data.get("regenerate", False) is not False:
        return None
    if seed is not None and not (_int(seed) and 0 <= seed <= MAX_SEED):
        return None
    if timeout_ms is not None and not (_int(timeout_ms) and 10 <= timeout_ms <= 600_000):
        return None
    try:
        text = validate_upper(upper, "upper")
    except InvalidInput:
        return None
    return CoupletRequest(style=style, upper=text, params=DecodeParams(n=1, seed=seed),
                          timeout_s=None if timeout_ms is None else timeout_ms / 1000.0)


def _json_content(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return bytes(value).split(b";")[0].strip().lower() == b"application/json"
    return True  # no content type: the route parses the body as JSON too


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole body, or what came before a non-body message (returned too)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), message
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), None


class CacheHitFastPath:
    """Answers cached ``POST /v1/couplets`` requests before the router (module docstring)."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        svc = self.runtime.service if self.runtime.serving else None
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH
                or svc is None or not _json_content(scope)):
            await self.app(scope, receive, send)
            return
        body, other = await _read_body(receive)
        req = plain_request(body) if other is None else None
        hit = await svc.cached(req) if req is not None else None
        if hit is not None:
            scope["route"] = _ROUTE
            await _send_json(send, _couplet_body(hit, svc.model_tag))
            return
        if req is not None:  # looked up and missed: the route must not count a second miss
            scope.setdefault("state", {})[CACHE_CHECKED] = True
        await self.app(scope, _replay(body, other, receive), send)


def _couplet_body(answer: Answer, model_tag: str) -> bytes:
    return json_bytes(couplet_json(answer, model_tag, 1))


async def _send_json(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode("ascii"))]})
    await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, other: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then whatever comes next."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": other is not None}]
    if other is not None:
        pending.append(other)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
