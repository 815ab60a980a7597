"""The operators' key: ``CHUNLIAN_API_KEYS`` guards the endpoints that take bulk work.

The public endpoints (``/v1/couplets``, ``/v1/couplets/compose``: one couplet a request, what
the campaign page calls) stay open. The bulk ones take a key when any is configured:
``/v1/jobs`` (up to 10,000 items a request) and ``/v1/couplets/batch`` (up to 256), since one
anonymous call of either is hundreds of couplets' work, which a per-client request rate at the
edge counts as one request. Without configured keys everything is open (the embedded default).
"""

from __future__ import annotations

import hmac

from fastapi import Request
from starlette.exceptions import HTTPException

API_KEY_HEADER = "X-API-Key"
KEY_NEEDED = "API keys are configured and X-API-Key is missing or wrong."  # the 401 in the OpenAPI docs


def require_api_key(request: Request) -> None:
    """401 unless ``X-API-Key`` is one of ``settings.api_key_set`` (when any is set)."""
    keys = request.app.state.runtime.settings.api_key_set
    if not keys:
        return
    given = request.headers.get(API_KEY_HEADER, "")
    if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        raise HTTPException(401, f"a valid {API_KEY_HEADER} header is required", {"WWW-Authenticate": "ApiKey"})
