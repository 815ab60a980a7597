"""Result caching: one ``CacheStore`` interface, an in-process LRU and Redis.

``build_cache(settings)`` gives the service's chain: the in-process LRU (unless
``cache_size`` is 0), then Redis when ``redis_url`` is set.
"""

from __future__ import annotations

from collections.abc import Callable

from chunlian.cache.base import CacheStore, CacheUnavailable
from chunlian.cache.keys import KEY_PREFIX, cache_key
from chunlian.cache.memory import MemoryStore
from chunlian.cache.redis import RedisStore
from chunlian.cache.tiered import LookupHook, ResultCache
from chunlian.config import Settings

__all__ = [
    "KEY_PREFIX", "CacheStore", "CacheUnavailable", "LookupHook", "MemoryStore", "RedisStore",
    "ResultCache", "build_cache", "cache_key",
]


def build_cache(
    settings: Settings,
    on_lookup: LookupHook | None = None,
    on_redis_state: Callable[[bool], None] | None = None,
) -> ResultCache:
    """The cache chain the settings ask for (memory first, then Redis if configured)."""
    stores: list[CacheStore] = []
    if settings.cache_size > 0:
        stores.append(MemoryStore(settings.cache_size))
    if settings.redis_url:
        stores.append(RedisStore(settings.redis_url, on_state_change=on_redis_state))
    return ResultCache(stores, settings.cache_ttl_s, on_lookup)
