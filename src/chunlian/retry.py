"""How chunlian's own HTTP clients (``chunlian jobs``, ``chunlian warmup``) treat a refusal.

A 429 (a full queue, or nginx's per-client rate) and a 503 (an instance not ready yet) are
answered before any work is done, so sending the same request again is safe, POSTs included.
The client waits what ``Retry-After`` asks (else a doubling back-off), at most
``MAX_RETRY_WAIT_S`` a time and ``MAX_RETRIES`` times, then gives up and reports the refusal.
"""

from __future__ import annotations

RETRY_STATUSES = (429, 503)
# a batch item refused for load, not for what it asked: worth sending again
RETRY_ITEM_CODES = frozenset({"overloaded", "engine_stopped", "not_ready"})
MAX_RETRIES = 8
MAX_RETRY_WAIT_S = 30.0


def retry_after_s(value: str | None, attempt: int) -> float:
    """The wait a refusal asks for (``Retry-After`` seconds), else a doubling back-off
    (``attempt`` counts from 0), bounded to 0.1 .. ``MAX_RETRY_WAIT_S``."""
    try:
        wait = float(value) if value is not None else 2.0 ** attempt
    except ValueError:
        wait = 2.0 ** attempt
    return min(MAX_RETRY_WAIT_S, max(0.1, wait))
