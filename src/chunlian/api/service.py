"""Answering a couplet request: the result cache in front of the engine.

* A request whose output is fixed by its key (greedy, or seeded) is looked up first and
  stored after generation (key: ``chunlian.cache.keys``).
* ``regenerate`` samples with a fresh random seed, skips the cache read, and writes
  nothing, so the cached default answer is never replaced.
* An answer is stored under the mode that served it (``engine.tiers``). A lookup tries the
  modes the request accepts, best first: a cached best answer serves any request, a cached
  good or fast one never answers ``quality: "best"`` (``LOOKUP``).
Identical concurrent misses are merged by the engine's coalescing, not here.

Deadlines count from the request's arrival (``arrival_s``, ``time.perf_counter()`` when the
app first saw it): the engine gets what is left of the budget, a request whose budget is
already spent never reaches it, and the caller gets ``DeadlineExceeded`` *at* the deadline
even when its generation is still running (the engine drops expired requests from its queue;
a sequence already decoding gets ``RUNNING_GRACE_S`` more, ``engine.scheduler``). An answer
finished within that grace is cached, so a retry of the same line is a hit.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from chunlian.api.hotlines import HotLines
from chunlian.cache import ResultCache, cache_key
from chunlian.config import EngineSettings
from chunlian.engine.client import EngineClient
from chunlian.engine.composed import generate_composed, wants_search
from chunlian.errors import Cancelled, DeadlineExceeded
from chunlian.types import CoupletRequest, CoupletResult, Quality, Served

# a request's deadline when it sets none: CHUNLIAN_DEFAULT_TIMEOUT_MS's default, unless given
DEFAULT_TIMEOUT_S = EngineSettings.defaults().default_timeout_ms / 1000.0
# the cached answers a request of each quality accepts, in the order they are looked up
LOOKUP: dict[Quality, tuple[Served, ...]] = {
    "best": ("best",), "auto": ("best", "good", "fast"), "fast": ("best", "good", "fast"),
}
AnswerHook = Callable[[Served, bool], None]  # (served, cached): metrics
# an idle upgrade's deadline (``api.upgrade``): it runs at bulk priority on an idle engine,
# and gives way to live work by being cancelled, not by its deadline
UPGRADE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Answer:
    """A result and whether it came from the cache."""

    result: CoupletResult
    cached: bool


class CoupletService:
    """Cache lookups and engine generation for the HTTP routes and warm-up."""

    def __init__(self, engine: EngineClient, cache: ResultCache, default_timeout_s: float = DEFAULT_TIMEOUT_S,
                 rules_tag: str = "", on_answer: AnswerHook | None = None, composed_width: int = 0,
                 hot: HotLines | None = None) -> None:
        self.engine = engine
        # the lines answered below the best mode, for the idle upgrade (``api.upgrade``);
        # given only where the engine has the quality modes; None: not noted
        self.hot = hot
        # live generations in flight, and what to call when one starts (the idle upgrade
        # gives way)
        self.live = 0
        self.last_live_s = 0.0  # time.monotonic() when a live generation last started or ended
        self.on_live: Callable[[], None] | None = None
        # > 0: the engine has the quality modes, and composed couplets in best or auto are
        # written in two stages, the 上联 searched at this width (``engine.composed``)
        self.composed_width = composed_width
        self.searches = composed_width > 0
        self.on_answer = on_answer
        self.cache = cache
        self.default_timeout_s = default_timeout_s
        # decoding rules beyond the model's (``Settings.rules_tag``: their version and the
        # zodiac year): an answer cached under other rules is no answer under these
        self.rules_tag = rules_tag

    def _key(self, req: CoupletRequest, served: Served) -> str:
        tag = self.engine.model_tag
        if served != "fast":  # searched answers: the search weights wrote them, the served ones reranked
            tag = f"{tag}+{self.engine.search_tag}"
        return cache_key(f"{tag}#{self.rules_tag}" if self.rules_tag else tag, req, served)

    def _served_keys(self, req: CoupletRequest) -> tuple[Served, ...]:
        """The modes whose cached answers ``req`` accepts (a sampled one: its own, fast)."""
        unseeded_composed = self.searches and req.upper is None and req.params.seed is None
        return LOOKUP[req.quality] if req.searchable or unseeded_composed else ("fast",)

    def _composed(self, req: CoupletRequest) -> bool:
        """Whether ``req`` is a composed couplet for the quality modes (``engine.composed``).
        Not an ``auto`` one while requests wait for the engine: its 上联 search would take
        main rows from them, and ``auto`` steps down under load (one greedy sequence)."""
        if not (self.searches and wants_search(req)):
            return False
        return req.quality != "auto" or self.engine.stats.queue_depth == 0

    def count(self, answer: Answer, req: CoupletRequest | None = None) -> Answer:
        """Report ``answer`` (to ``req``) to the metrics hook, and note ``req`` as a hot
        line when the best mode could answer it and did not; returns ``answer``."""
        if self.on_answer is not None:
            self.on_answer(answer.result.served, answer.cached)
        if self.hot is not None and req is not None and answer.result.served != "best" \
                and "best" in self._served_keys(req):
            self.hot.asked(self._key(req, "best"), req)
        return answer

    async def upgrade(self, req: CoupletRequest) -> bool:
        """Write ``req``'s best answer and cache it under the best mode's key, at bulk
        priority (the idle upgrade: ``api.upgrade``). False when it is cached already
        (another instance sharing Redis upgraded it) or the engine stepped it down."""
        key = self._key(req, "best")
        if await self.cache.contains(key):
            return False
        result = await self._write(replace(req, quality="best", priority="bulk", timeout_s=UPGRADE_TIMEOUT_S))
        if result.served != "best":
            return False
        await self.cache.put(key, result)
        if self.hot is not None:
            self.hot.upgraded(key)
        return True

    @property
    def model_tag(self) -> str:
        """``name@version`` of the serving model."""
        return self.engine.model_tag

    async def cached(self, req: CoupletRequest) -> Answer | None:
        """The cached answer for ``req``, or None (fast path: no engine involved)."""
        hit = await self.cache.get_first([self._key(req, served) for served in self._served_keys(req)])
        return None if hit is None else Answer(hit, True)

    async def generate(
        self, req: CoupletRequest, *, regenerate: bool = False, arrival_s: float | None = None,
        gone: asyncio.Future[Any] | None = None,
    ) -> Answer:
        """Generate ``req`` and cache the result (``regenerate``: fresh seed, no write).

        With ``arrival_s`` the deadline counts from then (module docstring). ``gone``: a
        future that completes when the caller has left (its client closed the connection):
        the generation is then cancelled, which frees its batch slot, and ``Cancelled`` is
        raised. One task and one wait carry the deadline and the watch together: this runs
        on the event loop for every cache miss."""
        if arrival_s is None and gone is None:
            return Answer(await self._generate(req, regenerate), False)
        timeout_s = req.timeout_s if req.timeout_s is not None else self.default_timeout_s
        deadline_s = (arrival_s if arrival_s is not None else time.perf_counter()) + timeout_s
        left_s = deadline_s - time.perf_counter()
        if left_s <= 0:
            raise DeadlineExceeded(f"deadline of {timeout_s:.3f} s passed before generation began")
        work = asyncio.ensure_future(self._generate(replace(req, timeout_s=left_s), regenerate))
        try:
            # not wait_for: at the deadline the generation must go on (and be cached)
            await asyncio.wait((work,) if gone is None else (work, gone), timeout=left_s,
                               return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller's task is cancelled: so is its generation
            work.cancel()
            raise
        if not work.done():
            work.add_done_callback(_settle_orphan)
            if gone is not None and gone.done():
                work.cancel()
                raise Cancelled("the caller went away")
            raise DeadlineExceeded("deadline passed during generation (an answer finished within "
                                   "half a second is cached for a retry)")
        result = work.result()
        if time.perf_counter() > deadline_s:
            raise DeadlineExceeded("deadline passed while the answer was on its way (it is cached)")
        return Answer(result, False)

    async def _generate(self, req: CoupletRequest, regenerate: bool) -> CoupletResult:
        self.live += 1
        self.last_live_s = time.monotonic()
        if self.on_live is not None:
            self.on_live()
        try:
            return await self._generate_live(req, regenerate)
        finally:
            self.live -= 1
            self.last_live_s = time.monotonic()

    async def _generate_live(self, req: CoupletRequest, regenerate: bool) -> CoupletResult:
        if regenerate:
            fresh = replace(req, params=replace(req.params, seed=secrets.randbits(31)))
            return await self.engine.generate(fresh)
        result = await self._write(req)
        await self.cache.put(self._key(req, result.served), result)
        return result

    async def _write(self, req: CoupletRequest) -> CoupletResult:
        """``req``'s answer from the engine: a composed couplet in two stages where the
        quality modes write it (``_composed``), anything else as one request."""
        if self._composed(req):
            return await generate_composed(self.engine.generate, req, self.composed_width)
        return await self.engine.generate(req)

    async def answer(
        self, req: CoupletRequest, *, regenerate: bool = False, arrival_s: float | None = None
    ) -> Answer:
        """The cached answer when there is one (unless ``regenerate``), else a new one."""
        if not regenerate:
            hit = await self.cached(req)
            if hit is not None:
                return hit
        return await self.generate(req, regenerate=regenerate, arrival_s=arrival_s)


def _settle_orphan(work: asyncio.Future[CoupletResult]) -> None:
    """Retrieve the outcome of a generation whose caller got its deadline error (its errors
    were already answered for; this keeps asyncio from reporting them as never retrieved)."""
    if not work.cancelled():
        work.exception()
