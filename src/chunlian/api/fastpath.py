"""The fast path for plain ``POST /v1/couplets`` requests, in front of the router.

On New Year's Eve most requests repeat a hot line and are cache hits, so their cost is the
web framework's: routing, dependency solving, pydantic and the response class took about
half of a hit's CPU time. ``PlainCoupletFastPath`` (pure ASGI, inside ``ServiceMiddleware``, so
request ids, size limits, metrics and the access log still apply) reads the body, and when
it is a plain, valid request (the fields of ``CoupletIn`` with their exact types, no
``regenerate``, ``n`` = 1) answers it itself: from the cache, or through the same service
call, disconnect watch and error responses as the route (under overload most answers are
429s, and they must stay cheap too). Anything else -- a bad body, an unusual field, a
non-JSON content type, the service not ready -- goes on to the router with the body
replayed, so every error is exactly the route's. Both paths validate with ``CoupletIn`` and
build the same ``CoupletRequest``, hence the same cache key.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunlian.api.errors import chunlian_error_logged as on_chunlian_error
from chunlian.api.errors import json_bytes
from chunlian.api.routes import couplet_json, generate_for_client
from chunlian.api.runtime import Runtime
from chunlian.api.service import Answer
from chunlian.errors import ChunlianError, InvalidInput
from chunlian.types import CoupletRequest
from chunlian.validation import CoupletIn

PATH = "/v1/couplets"
_ROUTE = SimpleNamespace(path=PATH)  # the metrics' endpoint label, as the router would set it
_FIELDS = frozenset(CoupletIn.model_fields)


def plain_request(body: bytes) -> CoupletRequest | None:
    """The request ``body`` asks for, when it is a plain valid one (the route's own schema
    and text rules, no unknown field, no ``regenerate``, ``n`` = 1); None sends it the long
    way, which also produces every error."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # the route answers 422 for these
        return None
    if type(data) is not dict or not data.keys() <= _FIELDS:
        return None
    try:
        parsed = CoupletIn.model_validate(data)
        if parsed.regenerate or parsed.n != 1:
            return None
        return parsed.to_request()
    except (ValidationError, InvalidInput):
        return None


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


class PlainCoupletFastPath:
    """Answers plain ``POST /v1/couplets`` requests (cache hit or not) before the router
    (module docstring); everything else goes to the router."""

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
        if req is None:
            await self.app(scope, _replay(body, other, receive), send)
            return
        scope["route"] = _ROUTE
        hit = await svc.cached(req)
        if hit is not None:
            await _send_json(send, _couplet_body(hit, svc.model_tag))
            return
        # a miss: generate here too, exactly as the route does (same service call, same
        # disconnect watch, same error responses), without the framework's per-request work;
        # under overload most of these answers are 429s, and they must stay cheap
        replayed = _replay(body, None, receive)
        try:
            arrival_s = scope.get("state", {}).get("arrival_s")
            answer = await generate_for_client(replayed, svc, req, arrival_s=arrival_s)
        except ChunlianError as e:
            await on_chunlian_error(Request(scope, replayed), e)(scope, receive, send)
            return
        await _send_json(send, _couplet_body(answer, svc.model_tag))


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
