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

EXPOSED = ("X-Request-Id", "X-Chunlian-Instance", "Retry-After")
RawHeaders = list[tuple[bytes, bytes]]


class ServiceCORS(CORSMiddleware):
    """Starlette's CORS, with a refused preflight in the service's error shape."""

    def preflight_response(self, request_headers: Headers) -> Response:
        resp = super().preflight_response(request_headers)
        if resp.status_code != 400:
            return resp
        what = bytes(resp.body).decode().removeprefix("Disallowed CORS ")
        headers = {k: v for k, v in resp.headers.items() if k.lower().startswith(("access-control-", "vary"))}
        return error_response(400, "cors_refused", f"this cross-origin request is not allowed: {what}",
                              "Origin", headers=headers)

    def refusal_headers(self, scope: Scope) -> RawHeaders:
        """The CORS headers of an answer made before this layer (``ServiceMiddleware``'s
        413/431), by this layer's own origin rule: without them a page on an allowed origin
        reads its "too large" as a network error. Empty for a request from no allowed origin."""
        origin = Headers(scope=scope).get("origin")
        if origin is None or not self.is_allowed_origin(origin):
            return []
        allow = "*" if self.allow_all_origins else origin
        return [(b"access-control-allow-origin", allow.encode("latin-1")), (b"vary", b"Origin"),
                (b"access-control-expose-headers", self.simple_headers["Access-Control-Expose-Headers"].encode())]


def cors(app: ASGIApp, origins: tuple[str, ...]) -> ServiceCORS:
    """Cross-origin calls from ``origins`` (a campaign page served from another site).

    Inside ``ServiceMiddleware``, so preflights and answers still carry ``X-Request-Id``; the
    headers a page may read are exposed. The refusals ``ServiceMiddleware`` makes itself (413,
    431, 400) never reach this layer: they take its ``refusal_headers`` instead."""
    return ServiceCORS(
        app, allow_origins=list(origins), allow_methods=["GET", "POST", "DELETE"],
        allow_headers=["Content-Type", "X-Request-Id", "X-API-Key"],
        expose_headers=list(EXPOSED), max_age=600,
    )
