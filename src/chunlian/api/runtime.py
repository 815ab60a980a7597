"""The live state of one service instance and its start-up / shut-down sequence.

Start-up, in the app's lifespan:
1. ``load()`` (before the port opens): build the engine from the settings unless one was
   given; a missing or broken model fails start-up with its message.
2. ``bring_up()`` (in the background, the port open, ``/readyz`` 503): start the engine,
   check Redis, run the warm-up, then mark the instance ready.
Drain (``api.drain``, on SIGTERM): ``begin_drain()`` fails readiness while the requests in
flight finish. Shut-down: not ready, stop the warm-up, stop the engine (pending requests fail with
``EngineStopped``), close the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time

from chunlian.api.drain import Drain
from chunlian.api.hotlines import HotLines
from chunlian.api.metrics import ServiceMetrics
from chunlian.api.service import CoupletService
from chunlian.api.upgrade import IdleUpgrade
from chunlian.api.warmup import warm_local
from chunlian.cache import RedisStore, ResultCache, build_cache
from chunlian.config import Settings
from chunlian.engine.client import EngineClient
from chunlian.engine.composed import search_width

log = logging.getLogger("chunlian.api")


def _build_engine(settings: Settings) -> EngineClient:
    from chunlian.engine.config import EngineConfig

    config = EngineConfig.from_settings(settings)
    if config.in_child:  # the models load in the children, at start()
        from chunlian.engine.replicas import ReplicatedEngine

        return ReplicatedEngine.from_config(config)
    from chunlian.engine.engine import Engine

    return Engine.from_config(config)


def _composed_width(settings: Settings) -> int:
    """The width of a composed 上联's search (``engine.composed``) on the engine ``settings``
    build: at most each replica's rows; 0 without the quality modes."""
    if settings.beam_rows <= 0:
        return 0
    return search_width(settings.max_batch_size // settings.resolved_engine_replicas())


class Runtime:
    """Settings, metrics, cache, engine and readiness of one app instance."""

    def __init__(self, settings: Settings, engine: EngineClient | None = None) -> None:
        self.settings = settings
        self.metrics = ServiceMetrics(settings.max_queue_size, redis_configured=bool(settings.redis_url))
        self.cache: ResultCache = build_cache(
            settings, on_lookup=self.metrics.on_cache_lookup, on_redis_state=self.metrics.on_redis_state
        )
        self.metrics.init_cache_stores(s.name for s in self.cache.stores)
        self.engine: EngineClient | None = engine
        self.service: CoupletService | None = None
        self.upgrade: IdleUpgrade | None = None  # the idle upgrade of hot lines (api.upgrade)
        self.ready = False
        self.drain = Drain()
        self.failed: str | None = None
        self._bring_up: asyncio.Task[None] | None = None
        self._started = False

    @property
    def model_tag(self) -> str | None:
        """``name@version`` once the engine exists."""
        return None if self.engine is None else self.engine.model_tag

    @property
    def serving(self) -> bool:
        """Ready, and the engine (when it says) still running: /readyz and the routes use it."""
        return self.ready and bool(getattr(self.engine, "running", True))

    def set_ready(self, ready: bool) -> None:
        """Flip readiness (and its gauge)."""
        self.ready = ready
        self.metrics.ready.set(1 if ready else 0)

    def begin_drain(self) -> None:
        """Readiness fails from now on (and its gauge says 0); requests already in flight
        still find the service (``serving`` is unchanged)."""
        self.drain.begin()
        self.metrics.ready.set(0)

    async def load(self) -> None:
        """Build the engine from the settings when none was given (off the event loop)."""
        if self.engine is None:
            self.engine = await asyncio.to_thread(_build_engine, self.settings)
            if self.settings.engine_in_child:
                # the child loads the model now, so that a bad model fails start-up here
                # (the process exits) as it does in-process, rather than leaving the
                # instance alive and never ready
                self._started = True
                await self.engine.start()
        engine = self.engine
        self.metrics.bind_engine(engine, self.settings.resolved_device())
        engine.add_step_listener(self.metrics.on_step)
        width = _composed_width(self.settings)
        hot = HotLines(self.settings.hot_lines) if self.settings.idle_upgrade and width > 0 else None
        self.service = CoupletService(engine, self.cache, self.settings.default_timeout_ms / 1000.0,
                                      self.settings.rules_tag, on_answer=self.metrics.on_answer,
                                      composed_width=width, hot=hot)
        if hot is not None:
            self.upgrade = IdleUpgrade(self.service, hot, self.settings.idle_upgrade_after_ms / 1000.0,
                                       on_outcome=self.metrics.on_upgrade)
            self.metrics.hot_lines.set_function(lambda: hot.pending)

    def start_background(self) -> None:
        """Run ``bring_up`` as a task; readiness follows it."""
        self._bring_up = asyncio.get_running_loop().create_task(self.bring_up())

    async def bring_up(self) -> None:
        """Start the engine, check Redis, warm up, become ready."""
        assert self.engine is not None and self.service is not None, "load() first"
        try:
            self._started = True  # stop() is owed even if start() is interrupted
            await self.engine.start()
            for store in self.cache.stores:
                if isinstance(store, RedisStore) and not await store.check():
                    log.warning("starting without the Redis cache; it is retried in the background")
            if self.settings.warmup:
                await warm_local(self.service, self.settings.warmup)
            if self.settings.gc_freeze:
                freeze_startup_heap()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            log.exception("start-up failed; the instance stays not ready")
            return
        self.set_ready(True)
        if self.upgrade is not None:
            self.upgrade.start()
        if self.drain.draining:
            self.metrics.ready.set(0)
        log.info("ready: model %s, instance %s", self.model_tag, self.settings.instance_id)

    async def wait_ready(self) -> None:
        """Wait for ``bring_up`` to finish (tests, embedding)."""
        if self._bring_up is not None:
            await asyncio.shield(self._bring_up)

    async def shut_down(self) -> None:
        """Stop taking work, stop the engine, close the cache."""
        self.set_ready(False)
        if self._bring_up is not None and not self._bring_up.done():
            self._bring_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._bring_up
        if self.upgrade is not None:
            await self.upgrade.stop()
        if self.engine is not None and self._started:
            try:
                await self.engine.stop()
            except Exception:
                log.exception("engine stop failed")
        await self.cache.close()


def freeze_startup_heap() -> None:
    """Collect once, then exempt every live object from later collections (``gc.freeze``):
    what start-up built lives as long as the process, and each full collection walked all
    of it while the process stood still. Objects made later are collected as usual."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("froze %d start-up objects out of the garbage collector in %.2f s",
             gc.get_freeze_count(), time.perf_counter() - t0)
