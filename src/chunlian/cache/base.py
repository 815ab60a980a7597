"""The cache-store interface: one protocol, several backends (in-process LRU, Redis).

A store maps opaque keys (``chunlian.cache.keys``) to opaque text values
(``chunlian.cache.codec``). A store that cannot answer raises ``CacheUnavailable``; the
caller then bypasses it (treats the lookup as a miss) and counts an ``error``. A store
never blocks a request for long: every backend bounds its own latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class CacheUnavailable(Exception):
    """The store could not answer (backend down, timed out); bypass it for this request."""


@runtime_checkable
class CacheStore(Protocol):
    """An async key/value store with per-entry time-to-live."""

    @property
    def name(self) -> str:
        """Short label for metrics and logs (``memory``, ``redis``)."""
        ...

    async def get(self, key: str) -> str | None:
        """The value stored under ``key``, or None when absent or expired.

        Raises ``CacheUnavailable`` when the backend cannot answer.
        """
        ...

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        """The value stored under each of ``keys`` (None where absent), in one round trip.
        Raises ``CacheUnavailable`` when the backend cannot answer.
        """
        ...

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds.

        Raises ``CacheUnavailable`` when the backend cannot answer.
        """
        ...

    async def close(self) -> None:
        """Release connections and background tasks; the store is unusable afterwards."""
        ...
