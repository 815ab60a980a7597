"""Errors to HTTP: one body shape, ``{"error": {"code", "message", "field"}}``.

| error | status | code |
|---|---|---|
| ``InvalidInput``, request validation | 422 | ``invalid_input`` |
| unparseable JSON | 422 | ``invalid_json`` |
| ``Overloaded`` | 429 + ``Retry-After`` (whole seconds, >= 1) | ``overloaded`` |
| ``DeadlineExceeded`` | 504 | ``deadline_exceeded`` |
| ``EngineStopped``, ``Cancelled``, not ready, draining | 503 | ``engine_stopped`` / ``cancelled`` / ``not_ready`` / ``shutting_down`` |
| the client went away | 499 (never seen; for logs and metrics) | ``client_closed_request`` |
| body over the limit | 413 | ``body_too_large`` |
| anything else | 500 | ``internal`` (no detail: never a trace or a path) |
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from chunlian.errors import (
    Cancelled,
    ChunlianError,
    DeadlineExceeded,
    EngineStopped,
    InvalidInput,
    NotReady,
    Overloaded,
)
from chunlian.validation import validation_detail

log = logging.getLogger("chunlian.api")

_HTTP_CODES = {
    400: "invalid_json", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large",
    415: "unsupported_media_type", 431: "headers_too_large",
}


class ClientGone(Cancelled):
    """The client disconnected before its answer was ready (logged as 499, never sent)."""

    code = "client_closed_request"


class BodyTooLarge(StarletteHTTPException):
    """Raised while reading a request body that grew past the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")


def json_bytes(content: Any) -> bytes:
    """UTF-8 JSON; falls back to ASCII escapes for text UTF-8 cannot hold (lone surrogates)."""
    try:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The shared error shape."""
    return {"error": {"code": code, "message": message, "field": field}}


def error_response(
    status: int, code: str, message: str, field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An error response in the shared shape."""
    return Response(
        json_bytes(error_body(code, message, field)), status_code=status,
        media_type="application/json", headers=headers,
    )


def retry_after_header(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds, at least 1."""
    if not math.isfinite(seconds):
        seconds = 1.0
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def status_of(err: ChunlianError) -> tuple[int, dict[str, str] | None]:
    """HTTP status and extra headers for a chunlian error."""
    if isinstance(err, InvalidInput):
        return 422, None
    if isinstance(err, Overloaded):
        return 429, retry_after_header(err.retry_after_s)
    if isinstance(err, DeadlineExceeded):
        return 504, None
    if isinstance(err, ClientGone):
        return 499, None
    if isinstance(err, EngineStopped | Cancelled | NotReady):
        return 503, retry_after_header(1.0)
    return 500, None


def describe(err: ChunlianError) -> tuple[str, str, str | None]:
    """(code, message, field) of a chunlian error, safe to show to a client."""
    if isinstance(err, InvalidInput):
        return err.code, err.message, err.field
    status, _ = status_of(err)
    if status == 500:
        return "internal", "the server failed to answer this request", None
    return err.code, str(err) or err.code.replace("_", " "), None


def chunlian_error_response(err: ChunlianError) -> Response:
    """The response for a chunlian error."""
    status, headers = status_of(err)
    code, message, field = describe(err)
    return error_response(status, code, message, field, headers)


async def _on_chunlian_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ChunlianError)
    return chunlian_error_logged(request, exc)


def chunlian_error_logged(request: Request, exc: ChunlianError) -> Response:
    """The response for ``exc``, logging what a 500 hides from the client."""
    if status_of(exc)[0] == 500:  # the client sees no detail: the log must (e.g. a ModelError)
        log.error("%s answered 500: %s: %s rid=%s", request.url.path, type(exc).__name__, exc,
                  request.scope.get("state", {}).get("request_id", "-"))
    return chunlian_error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    code, message, field = validation_detail(list(exc.errors()))
    return error_response(422, code, message, field)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 400:  # FastAPI could not parse the body (e.g. nested too deep)
        return error_response(422, "invalid_json", "request body could not be parsed as JSON")
    code = _HTTP_CODES.get(status, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = dict(exc.headers or {})
    if status == 405:
        allow = allowed_methods(request)
        if allow:
            headers["Allow"] = allow
    return error_response(status, code, message, None, headers or None)


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str | None:
    """``Allow`` for a 405: every method some route serves at this path (Starlette names
    only the methods of the first route whose path matched, e.g. GET but not DELETE)."""
    routes = getattr(request.app, "routes", ())
    allowed = [m for m in _METHODS
               if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes)]
    return ", ".join(allowed) or None


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # Starlette's outermost error layer calls this, then re-raises ``exc``, which the
    # service middleware in front logs with the request id: not logged twice here.
    return error_response(500, "internal", "the server failed to answer this request")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to the shared shape (a bug's 500 included)."""
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_exception_handler(ChunlianError, _on_chunlian_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
