"""The Redis cache store: redis-py asyncio with hiredis, pooled, never in the way.

* Every command is bounded by ``timeout_s`` (socket connect and read timeouts, plus an
  overall deadline) and redis-py's own retries are off, so a dead or hung Redis costs a
  request at most about ``2 * timeout_s``, once.
* On the first failure the store goes *down*: it logs one line, drops its pooled
  connections and bypasses Redis (``CacheUnavailable`` at once, no network) while a
  background probe PINGs every ``retry_interval_s``. When a PING answers the store is *up*
  again and logs one line. State changes, not requests, produce log lines.
* At most ``max_connections`` commands are in flight; a request that finds them all busy
  bypasses the cache instead of queueing behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from chunlian.cache.base import CacheUnavailable

log = logging.getLogger("chunlian.cache.redis")

DEFAULT_TIMEOUT_S = 0.2
DEFAULT_RETRY_INTERVAL_S = 1.0


def _redact(url: str) -> str:
    """The URL without its password, for log lines."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


class RedisStore:
    """A ``CacheStore`` on Redis that bypasses itself while Redis is unreachable."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_interval_s: float = DEFAULT_RETRY_INTERVAL_S,
        max_connections: int = 256,
        on_state_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.url = _redact(url)
        self.timeout_s = timeout_s
        self.retry_interval_s = retry_interval_s
        self._pool: ConnectionPool = ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._client = Redis(connection_pool=self._pool)
        self._slots = asyncio.Semaphore(max_connections)
        self._up = True
        self._probe: asyncio.Task[None] | None = None
        self._closed = False
        self._on_state_change = on_state_change

    @property
    def name(self) -> str:
        """Metrics label of this store."""
        return "redis"

    @property
    def up(self) -> bool:
        """Whether the last contact with Redis succeeded."""
        return self._up

    # ---- the CacheStore interface ------------------------------------------------------
    async def get(self, key: str) -> str | None:
        """The value under ``key``; ``CacheUnavailable`` while Redis is down."""
        value = await self._call(lambda: self._client.get(key))
        return value if isinstance(value, str) else None

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        """The values under ``keys`` in one ``MGET``; ``CacheUnavailable`` while Redis is down."""
        values = await self._call(lambda: self._client.mget(list(keys)))
        return [v if isinstance(v, str) else None for v in values]

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        """``SET key value EX ttl_s``; ``CacheUnavailable`` while Redis is down."""
        await self._call(lambda: self._client.set(key, value, ex=ttl_s))

    async def close(self) -> None:
        """Stop the probe and close every connection."""
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        with contextlib.suppress(RedisError, OSError):
            await self._client.aclose()
        with contextlib.suppress(RedisError, OSError):
            await self._pool.disconnect()

    # ---- health ------------------------------------------------------------------------
    async def check(self) -> bool:
        """PING once now (start-up); on failure the store goes down and starts probing."""
        try:
            await self._call(self._client.ping, bypass_when_down=False)
        except CacheUnavailable:
            return False
        return True

    async def _call(
        self, op: Callable[[], Awaitable[Any]], *, bypass_when_down: bool = True
    ) -> Any:
        if self._closed:
            raise CacheUnavailable("redis store is closed")
        if bypass_when_down and not self._up:
            raise CacheUnavailable("redis is down")
        if self._slots.locked():
            raise CacheUnavailable("all redis connections are busy")
        async with self._slots:
            try:
                async with asyncio.timeout(2 * self.timeout_s):
                    result = await op()
            except (RedisError, OSError, TimeoutError) as e:
                await self._went_down(e)
                raise CacheUnavailable(f"redis error: {type(e).__name__}") from None
        return result

    # ---- state changes -----------------------------------------------------------------
    async def _went_down(self, err: BaseException) -> None:
        if not self._up:
            return
        self._up = False
        log.warning(
            "redis cache at %s unreachable (%s: %s); bypassing it, retrying every %.1f s",
            self.url, type(err).__name__, err, self.retry_interval_s,
        )
        self._notify(False)
        with contextlib.suppress(RedisError, OSError):
            await self._pool.disconnect()  # stale connections would each fail once more
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.retry_interval_s)
            try:
                async with asyncio.timeout(2 * self.timeout_s):
                    await self._client.ping()
            except (RedisError, OSError, TimeoutError):
                with contextlib.suppress(RedisError, OSError):
                    await self._pool.disconnect()
                continue
            self._up = True
            log.info("redis cache at %s reachable again; using it", self.url)
            self._notify(True)
            return

    def _notify(self, up: bool) -> None:
        if self._on_state_change is not None:
            self._on_state_change(up)
