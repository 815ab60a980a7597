"""Answering a couplet request: the result cache in front of the engine.

* A request whose output is fixed by its key (greedy, or seeded) is looked up first and
  stored after generation (key: ``chunlian.cache.keys``).
* ``regenerate`` samples with a fresh random seed, skips the cache read, and writes
  nothing, so the cached default answer is never replaced.
Identical concurrent misses are merged by the engine's coalescing, not here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from chunlian.cache import ResultCache, cache_key
from chunlian.types import CoupletRequest, CoupletResult


class EngineLike(Protocol):
    """The part of ``chunlian.engine.Engine`` the service uses."""

    model_tag: str
    stats: Any

    async def start(self) -> None:
        """Start the step loop."""
        ...

    async def stop(self) -> None:
        """Stop; every pending request fails with ``EngineStopped``."""
        ...

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate one request (raises ``Overloaded``, ``DeadlineExceeded``, ...)."""
        ...

    def add_step_listener(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(StepReport)`` on the engine thread after each step."""
        ...


@dataclass(frozen=True)
class Answer:
    """A result and whether it came from the cache."""

    result: CoupletResult
    cached: bool


class CoupletService:
    """Cache lookups and engine generation for the HTTP routes and warm-up."""

    def __init__(self, engine: EngineLike, cache: ResultCache) -> None:
        self.engine = engine
        self.cache = cache

    @property
    def model_tag(self) -> str:
        """``name@version`` of the serving model."""
        return self.engine.model_tag

    async def cached(self, req: CoupletRequest) -> Answer | None:
        """The cached answer for ``req``, or None (fast path: no engine involved)."""
        hit = await self.cache.get(cache_key(self.engine.model_tag, req))
        return None if hit is None else Answer(hit, True)

    async def generate(self, req: CoupletRequest, *, regenerate: bool = False) -> Answer:
        """Generate ``req`` and cache the result (``regenerate``: fresh seed, no write)."""
        if regenerate:
            fresh = replace(req, params=replace(req.params, seed=secrets.randbits(31)))
            return Answer(await self.engine.generate(fresh), False)
        result = await self.engine.generate(req)
        await self.cache.put(cache_key(self.engine.model_tag, req), result)
        return Answer(result, False)

    async def answer(self, req: CoupletRequest, *, regenerate: bool = False) -> Answer:
        """The cached answer when there is one (unless ``regenerate``), else a new one."""
        if not regenerate:
            hit = await self.cached(req)
            if hit is not None:
                return hit
        return await self.generate(req, regenerate=regenerate)
