"""Results through a chain of stores: nearest first (in-process LRU), then shared (Redis).

A lookup walks the chain and stops at the first hit, copying the answer into the stores
it passed (so a Redis hit is served from memory next time). A store that fails is
bypassed for that lookup. Every store consulted reports ``hit``, ``miss`` or ``error``
to ``on_lookup`` (metrics). Writes go to every store; a failing store is skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from chunlian.cache.base import CacheStore, CacheUnavailable
from chunlian.cache.codec import decode_result, encode_result
from chunlian.types import CoupletResult

log = logging.getLogger("chunlian.cache")

LookupHook = Callable[[str, str], None]  # (store name, "hit" | "miss" | "error")


class ResultCache:
    """Couplet results cached in ``stores`` (nearest first) for ``ttl_s`` seconds."""

    def __init__(
        self, stores: Sequence[CacheStore], ttl_s: int, on_lookup: LookupHook | None = None
    ) -> None:
        self.stores = tuple(stores)
        self.ttl_s = ttl_s
        self._on_lookup = on_lookup

    def _report(self, store: CacheStore, result: str) -> None:
        if self._on_lookup is not None:
            self._on_lookup(store.name, result)

    async def get(self, key: str) -> CoupletResult | None:
        """The cached result for ``key`` from the nearest store that has it, else None."""
        return await self.get_first((key,))

    async def get_first(self, keys: Sequence[str]) -> CoupletResult | None:
        """The cached result under the first of ``keys`` that the nearest store holding any
        of them has, else None: one lookup (one round trip) per store consulted."""
        for i, store in enumerate(self.stores):
            try:
                texts = await store.get_many(keys) if len(keys) > 1 else [await store.get(keys[0])]
            except CacheUnavailable:
                self._report(store, "error")
                continue
            found = next(((k, t) for k, t in zip(keys, texts, strict=True) if t is not None), None)
            if found is None:
                self._report(store, "miss")
                continue
            key, text = found
            try:
                result = decode_result(text)
            except ValueError as e:
                log.warning("ignoring a malformed %s cache entry: %s", store.name, e)
                self._report(store, "error")
                continue
            self._report(store, "hit")
            for nearer in self.stores[:i]:
                with contextlib.suppress(CacheUnavailable):
                    await nearer.set(key, text, self.ttl_s)
            return result
        return None

    async def contains(self, key: str) -> bool:
        """Whether any available store holds ``key`` (not counted as a lookup, nothing copied)."""
        for store in self.stores:
            with contextlib.suppress(CacheUnavailable):
                if await store.get(key) is not None:
                    return True
        return False

    async def put(self, key: str, result: CoupletResult) -> None:
        """Store ``result`` under ``key`` in every store that is available."""
        text = encode_result(result)
        for store in self.stores:
            with contextlib.suppress(CacheUnavailable):
                await store.set(key, text, self.ttl_s)

    async def close(self) -> None:
        """Close every store."""
        for store in self.stores:
            await store.close()
