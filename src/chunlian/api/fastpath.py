"""The fast path for plain ``POST /v1/couplets`` requests, in front of the router.

On New Year's Eve most requests repeat a hot line and are cache hits, so their cost is the
web framework's: routing, dependency solving, pydantic and the response class are a large
share of a hit's CPU time (``docs/performance.md``). ``PlainCoupletFastPath`` (pure ASGI, inside ``ServiceMiddleware``, so
request ids, size limits, metrics and the access log still apply) reads the body, and when
its shape is a plain, valid one (the fields of ``CoupletIn`` with their exact types, no
``regenerate``; any ``n``: the campaign page asks for 4) answers it itself, without the framework: with the route's own
handler, ``routes.couplet_reply`` (text rules, cache, generation, disconnect watch), and
the route's own error responses, ``errors.chunlian_error_logged`` (under overload most
answers are 429s, and they must stay cheap too). Anything else -- a body that does not
parse or fails the schema, an unusual field, a non-JSON content type, the service not
ready -- goes on to the router with the body replayed, so those errors are the framework's
own.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunlian.api.errors import chunlian_error_logged
from chunlian.api.routes import couplet_reply
from chunlian.api.runtime import Runtime
from chunlian.errors import ChunlianError
from chunlian.validation import CoupletIn

PATH = "/v1/couplets"
_ROUTE = SimpleNamespace(path=PATH)  # the metrics' endpoint label, as the router would set it
_FIELDS = frozenset(CoupletIn.model_fields)


def plain_body(body: bytes) -> CoupletIn | None:
    """``body`` parsed, when its shape is a plain valid request (the route's own schema, no
    unknown field, no ``regenerate``); None sends it the long way, which also answers every
    error of shape."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # the route answers 422 for these
        return None
    if type(data) is not dict or not data.keys() <= _FIELDS:
        return None
    try:
        parsed = CoupletIn.model_validate(data)
    except ValidationError:
        return None
    return None if parsed.regenerate else parsed


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
        parsed = plain_body(body) if other is None else None
        if parsed is None:
            await self.app(scope, _replay(body, other, receive), send)
            return
        scope["route"] = _ROUTE
        try:
            # the body is read: what ``receive`` gives next is what the disconnect watch needs
            reply = await couplet_reply(receive, svc, parsed, scope.get("state", {}).get("arrival_s"))
        except ChunlianError as e:
            await chunlian_error_logged(Request(scope, receive), e)(scope, receive, send)
            return
        await _send_json(send, reply)


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
