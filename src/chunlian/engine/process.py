"""An engine core in its own process (each of ``engine.replicas``' replicas), as vLLM v1 runs its
EngineCore: the API process keeps HTTP, the cache and the event loop; a child process keeps
the model, the scheduler and the engine thread, with its own interpreter lock and its own
core. In one process the web server and the engine thread take turns on one lock, so a
second core idles (``docs/performance.md``).

    API process                                  engine process (spawned)
    ProcessEngine.generate() ─("gen", id, req)──▶ reader thread ─▶ Engine.generate() task
          ▲                                                          │
          └── reader thread ◀──("answers", [("ok"/"err", id, ...)])── event loop ◀──┘
              ◀──("stats", EngineStats, steps) every 0.25 s: metrics, step listeners

Messages go over one ``multiprocessing`` pipe. Errors cross as (class name, message, extra)
and are rebuilt from ``chunlian.errors``. Every future completes on every path: result,
error, cancellation (sent to the child, which frees the slot), the child's exit or crash
(every pending request fails with ``EngineStopped`` and ``running`` turns false, so the
instance reports not ready), and ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from chunlian import errors as E
from chunlian.engine.config import EngineConfig
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.types import CoupletRequest, CoupletResult

log = logging.getLogger("chunlian.engine")
STATS_EVERY_S = 0.25
START_LIMIT_S = 300.0
STOP_LIMIT_S = 15.0
ErrorWire = tuple[str, str, dict[str, Any]]


def encode_error(e: BaseException) -> ErrorWire:
    """An error as plain data: (class name in ``chunlian.errors``, message, extra fields)."""
    if not isinstance(e, E.ChunlianError):
        return "ModelError", f"generation failed: {type(e).__name__}", {}
    extra: dict[str, Any] = {}
    if isinstance(e, E.Overloaded):
        extra["retry_after_s"] = e.retry_after_s
    if isinstance(e, E.InvalidInput):
        extra["field"] = e.field
    return type(e).__name__, str(e), extra


def decode_error(wire: ErrorWire) -> E.ChunlianError:
    name, message, extra = wire
    cls = getattr(E, name, None)
    if not (isinstance(cls, type) and issubclass(cls, E.ChunlianError)):
        return E.ModelError(message)
    if cls is E.Overloaded:
        return E.Overloaded(message, float(extra.get("retry_after_s", 1.0)))
    if cls is E.InvalidInput:
        return E.InvalidInput(message, extra.get("field"))
    return cls(message)


class ProcessEngine:
    """``Engine``'s interface (``api.service.EngineLike``) over an engine in a child process."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_tag = "chunlian-couplet@loading"
        self.stats = EngineStats(max_queue_size=config.max_queue_size)
        self._listeners: list[Callable[[StepReport], None]] = []
        self._pending: dict[int, asyncio.Future[CoupletResult]] = {}
        self._ids = itertools.count(1)
        self._conn: Connection | None = None
        self._proc: mp.process.BaseProcess | None = None
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[str] | None = None
        self._alive = False
        self._send_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the engine process and wait until its model is loaded (once: a second call
        returns at once); raises ``ModelError`` when the child cannot load the model."""
        if self._proc is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        ctx = mp.get_context("spawn")  # never fork a process that may hold torch threads
        parent, child = ctx.Pipe(duplex=True)
        self._conn = parent
        self._proc = ctx.Process(target=child_main, args=(self.config, child),
                                 name="chunlian-engine-core", daemon=True)
        self._proc.start()
        child.close()
        self._alive = True
        self._reader = threading.Thread(target=self._read, name="chunlian-engine-pipe", daemon=True)
        self._reader.start()
        try:
            self.model_tag = await asyncio.wait_for(asyncio.shield(self._ready), START_LIMIT_S)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the child (its pending requests fail with ``EngineStopped``) and wait for it."""
        if self._proc is None:
            return
        self._send(("stop",))
        proc = self._proc
        await asyncio.to_thread(proc.join, STOP_LIMIT_S)
        if proc.is_alive():
            proc.kill()
            await asyncio.to_thread(proc.join, 5.0)
        self._alive = False
        self._fail_all(E.EngineStopped("engine stopped"))

    @property
    def running(self) -> bool:
        # the reader thread clears ``_alive`` when the pipe closes, which the child's exit
        # does; no waitpid here: this is read on every request (by each replica's router too)
        return self._alive

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self._listeners.append(fn)

    # ---- requests --------------------------------------------------------------------------
    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """Generate in the engine process; raises what ``Engine.generate`` raises."""
        if not self.running or self._loop is None:
            raise E.EngineStopped("engine is not running")
        rid = next(self._ids)
        fut: asyncio.Future[CoupletResult] = self._loop.create_future()
        self._pending[rid] = fut
        timeout_s = req.timeout_s if req.timeout_s is not None else self.config.default_timeout_ms / 1000
        try:
            self._send(("gen", rid, req))
            # the child enforces the deadline; the margin only guards against a stuck child
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s + 2.0)
        except TimeoutError:
            self._send(("cancel", rid))
            raise E.DeadlineExceeded(f"no answer within {timeout_s:.3f} s") from None
        except asyncio.CancelledError:
            self._send(("cancel", rid))
            raise
        finally:
            self._pending.pop(rid, None)

    def _send(self, msg: tuple[Any, ...]) -> None:
        conn = self._conn
        if conn is None:
            raise E.EngineStopped("engine is not running")
        try:
            with self._send_lock:
                conn.send(msg)
        except (OSError, ValueError) as e:  # the child is gone
            if msg[0] == "gen":
                raise E.EngineStopped("engine process is gone") from e

    # ---- the pipe reader (its own thread) ------------------------------------------------------
    def _read(self) -> None:
        assert self._conn is not None and self._loop is not None
        loop, conn = self._loop, self._conn
        try:
            while True:
                msg = conn.recv()
                kind = msg[0]
                if kind == "answers":  # a batch of ("ok" | "err", id, payload): one loop wake-up
                    loop.call_soon_threadsafe(self._settle_all, msg[1])
                elif kind == "stats":
                    self._on_stats(msg[1], msg[2])
                elif kind == "ready":
                    loop.call_soon_threadsafe(self._set_ready, msg[1], None)
                elif kind == "failed":
                    loop.call_soon_threadsafe(self._set_ready, None, E.ModelError(msg[1]))
                elif kind == "stopped":
                    break
        except (EOFError, OSError):
            log.error("the engine process went away")
        except RuntimeError:  # the event loop closed under us (interpreter shutdown)
            return
        self._alive = False
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._fail_all, E.EngineStopped("engine process exited"))
            loop.call_soon_threadsafe(self._set_ready, None, E.ModelError("engine process exited"))

    def _set_ready(self, tag: str | None, error: BaseException | None) -> None:
        if self._ready is None or self._ready.done():
            return
        if error is not None:
            self._ready.set_exception(error)
        else:
            self._ready.set_result(tag or "chunlian-couplet@unknown")

    def _settle_all(self, answers: list[tuple[str, int, Any]]) -> None:
        for kind, rid, payload in answers:
            fut = self._pending.get(rid)
            if fut is None or fut.done():
                continue
            if kind == "ok":
                fut.set_result(payload)
            else:
                fut.set_exception(decode_error(payload))

    def _on_stats(self, stats: dict[str, Any], steps: list[tuple[int, float, int]]) -> None:
        for k, v in stats.items():
            setattr(self.stats, k, v)
        for batch, step_s, tokens in steps:
            report = StepReport(batch, step_s, tokens)
            for fn in self._listeners:
                try:
                    fn(report)
                except Exception:  # a metrics hook must never stop the pipe
                    log.exception("step listener failed")

    def _fail_all(self, error: E.ChunlianError) -> None:
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # retrieved: its caller may be gone


# ---- the child -------------------------------------------------------------------------------
def child_main(config: EngineConfig, conn: Connection) -> None:
    """Entry point of the engine process: load the model, serve the pipe until told to stop."""
    from chunlian.engine.engine import Engine

    lock = threading.Lock()

    def send(msg: tuple[Any, ...]) -> None:
        with lock:
            conn.send(msg)

    with contextlib.suppress(OSError):
        # the web process answers hits, 429s and health checks in microseconds; under
        # overload it must win the CPU over the engine, not wait behind it. Applied here,
        # before any thread starts, so every thread of this process inherits it; the engine
        # gets engine_nice 0, so its thread does not add the same nice again.
        os.nice(config.engine_nice)
    try:
        engine = Engine.from_config(dataclasses.replace(config, engine_nice=0))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which stays not ready
        send(("failed", f"{type(e).__name__}: {e}"))
        return
    asyncio.run(_serve(engine, conn, send))


async def _serve(engine: Any, conn: Connection, send: Callable[[tuple[Any, ...]], None]) -> None:
    loop = asyncio.get_running_loop()
    tasks: dict[int, asyncio.Task[None]] = {}
    steps: list[tuple[int, float, int]] = []
    engine.add_step_listener(lambda r: steps.append((r.batch_size, r.step_s, r.tokens)))
    stop = asyncio.Event()

    # answers finished in one turn of the loop (a step's) go back as one message: one pipe
    # write here and one wake-up of the API process's loop, instead of one per answer
    outbox: list[tuple[str, int, Any]] = []

    def flush() -> None:
        if outbox:
            batch = outbox[:]
            outbox.clear()
            send(("answers", batch))

    def answer(msg: tuple[str, int, Any]) -> None:
        if not outbox:
            loop.call_soon(flush)
        outbox.append(msg)

    async def run(rid: int, req: CoupletRequest) -> None:
        try:
            answer(("ok", rid, await engine.generate(req)))
        except asyncio.CancelledError:
            answer(("err", rid, encode_error(E.Cancelled("request cancelled"))))
        except Exception as e:  # noqa: BLE001 - every error goes back to its caller
            answer(("err", rid, encode_error(e)))
        finally:
            tasks.pop(rid, None)

    def on_message(msg: tuple[Any, ...]) -> None:
        if msg[0] == "gen":
            tasks[msg[1]] = loop.create_task(run(msg[1], msg[2]))
        elif msg[0] == "cancel":
            task = tasks.get(msg[1])
            if task is not None:
                task.cancel()
        else:
            stop.set()

    def reader() -> None:
        try:
            while True:
                msg = conn.recv()
                loop.call_soon_threadsafe(on_message, msg)
                if msg[0] == "stop":
                    return
        except (EOFError, OSError):  # the parent is gone: stop too
            loop.call_soon_threadsafe(stop.set)

    await engine.start()
    send(("ready", engine.model_tag))
    threading.Thread(target=reader, name="chunlian-engine-pipe", daemon=True).start()

    async def report() -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            batch = steps[:]
            del steps[: len(batch)]
            send(("stats", dataclasses.asdict(engine.stats), batch))

    reporter = loop.create_task(report())
    await stop.wait()
    reporter.cancel()
    await engine.stop()  # pending requests fail with EngineStopped, sent back by run()
    if tasks:
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    with contextlib.suppress(OSError):
        flush()  # the last answers go before "stopped"
        send(("stats", dataclasses.asdict(engine.stats), []))
        send(("stopped",))
