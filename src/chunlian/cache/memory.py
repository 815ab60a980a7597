"""A bounded in-process LRU cache with per-entry TTL (the default store).

Pure Python on the event loop: no locks are needed because every call runs on the loop's
thread and none of them awaits. ``max_entries == 0`` disables the store (every lookup
misses, nothing is kept).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence


class MemoryStore:
    """Least-recently-used eviction past ``max_entries``; expired entries read as absent."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, str]] = OrderedDict()

    @property
    def name(self) -> str:
        """Metrics label of this store."""
        return "memory"

    def __len__(self) -> int:
        return len(self._data)

    async def get(self, key: str) -> str | None:
        """The live value under ``key`` (refreshing its recency), else None."""
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires <= self._clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        """The live value under each of ``keys`` (``get``'s)."""
        return [await self.get(k) for k in keys]

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        """Keep ``value`` for ``ttl_s`` seconds, evicting the least recently used entries."""
        if self.max_entries == 0:
            return
        self._data[key] = (self._clock() + ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def close(self) -> None:
        """Drop every entry."""
        self._data.clear()
