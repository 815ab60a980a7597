"""Cross-origin calls (``CHUNLIAN_CORS_ORIGINS``): a campaign page served from another site
(a CDN) calling the API. Off by default (same origin only: the shipped page needs nothing).

Starlette's ``CORSMiddleware``, placed inside ``ServiceMiddleware`` by ``create_app``, with a
refused preflight in the service's error shape (``cors_refused``).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Scope

from chunlian.api.errors import error_response


class _CORS(CORSMiddleware):
    """Starlette's CORS, with a refused preflight in the service's error shape."""

    def preflight_response(self, request_headers: Headers) -> Response:
        resp = super().preflight_response(request_headers)
        if resp.status_code != 400:
            return resp
        what = bytes(resp.body).decode().removeprefix("Disallowed CORS ")
        headers = {k: v for k, v in resp.headers.items() if k.lower().startswith(("access-control-", "vary"))}
        return error_response(400, "cors_refused", f"this cross-origin request is not allowed: {what}",
                              "Origin", headers=headers)


def cors(app: ASGIApp, origins: tuple[str, ...]) -> ASGIApp:
    """Cross-origin calls from ``origins`` (a campaign page served from another site).

    Inside ``ServiceMiddleware``, so preflights and answers still carry ``X-Request-Id``; the
    headers a page may read are exposed. The refusals ``ServiceMiddleware`` makes itself (413,
    431, 400) never reach this layer: they take ``refusal_headers`` instead."""
    return _CORS(
        app, allow_origins=list(origins), allow_methods=["GET", "POST", "DELETE"],
        allow_headers=["Content-Type", "X-Request-Id", "X-API-Key"],
        expose_headers=list(EXPOSED), max_age=600,
    )


EXPOSED = ("X-Request-Id", "X-Chunlian-Instance", "Retry-After")


def refusal_headers(origins: tuple[str, ...], scope: Scope) -> list[tuple[bytes, bytes]]:
    """The CORS headers of an answer made before the CORS layer (``ServiceMiddleware``'s
    413/431): without them a page on an allowed origin reads its "too large" as a network error.
    Empty when ``origins`` is empty or the request's ``Origin`` is not among them."""
    if not origins:
        return []
    origin = next((bytes(v) for k, v in scope.get("headers", ()) if k == b"origin"), None)
    if origin is None:
        return []
    if "*" in origins:
        allow = b"*"
    elif origin.decode("latin-1") in origins:
        allow = origin
    else:
        return []
    return [(b"access-control-allow-origin", allow), (b"vary", b"Origin"),
            (b"access-control-expose-headers", ", ".join(EXPOSED).encode())]
