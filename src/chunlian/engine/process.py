"""An engine core in its own process (each of ``engine.replicas``' replicas), as vLLM v1 runs its
EngineCore: the API process keeps HTTP, the cache and the event loop; a child process keeps
the model and the core (``engine.corerun``), with its own interpreter lock. In one process
the web server and the engine thread take turns on one lock, so a second core idles
(``docs/performance.md``).

    API process                                    engine process (spawned, niced once)
    ProcessEngine.generate() ──Add / Abort──▶ CoreLoop: EngineCore.add_request / abort, step()
          ▲                                                          │
          └── reader thread ◀── Answers (one per step), Stats (every 0.25 s) ──┘

Messages are the typed dataclasses of ``engine.messages`` over one ``multiprocessing``
pipe; errors cross as plain data and are rebuilt from ``chunlian.errors``. Every future
completes on every path: result, error, cancellation (an ``Abort`` frees the rows), the
child's exit or crash (every pending request fails with ``EngineStopped`` and ``running``
turns false, so the instance reports not ready), a child that stops stepping (its periodic
stats stop: ``running`` turns false after ``WEDGED_AFTER_S``, and ``stop`` kills it), and
``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from chunlian import errors as E
from chunlian.engine.config import EngineConfig
from chunlian.engine.messages import (
    Abort,
    Add,
    Answer,
    Answers,
    Failed,
    Ready,
    Stats,
    Stop,
    Stopped,
    decode_error,
)
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.types import CoupletRequest, CoupletResult

log = logging.getLogger("chunlian.engine")
START_LIMIT_S = 300.0
STOP_LIMIT_S = 15.0
# a child that sent nothing for this long is wedged (it sends stats every 0.25 s, idle or
# not, between steps; a step takes well under a second): it reports not running, so the
# dispatcher routes nothing more to it and its supervisor replaces it
WEDGED_AFTER_S = 30.0


class ProcessEngine:
    """An ``EngineClient`` over an engine core in a child process."""

    def __init__(self, config: EngineConfig, child: Callable[[EngineConfig, Connection], None] | None = None) -> None:
        self.config = config
        self._child = child if child is not None else child_main  # the process's entry point
        self.model_tag = "chunlian-couplet@loading"
        self.search_tag = self.model_tag
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
        self._heard_s: float | None = None  # when the child last sent anything (once ready)
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
        self._proc = ctx.Process(target=self._child, args=(self.config, child),
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
        wedged = self.wedged
        self._send(Stop())
        proc = self._proc
        await asyncio.to_thread(proc.join, 0.0 if wedged else STOP_LIMIT_S)
        if proc.is_alive():
            proc.kill()
            await asyncio.to_thread(proc.join, 5.0)
        self._alive = False
        self._fail_all(E.EngineStopped("engine stopped"))

    @property
    def running(self) -> bool:
        # the reader thread clears ``_alive`` when the pipe closes, which the child's exit
        # does; no waitpid here: this is read on every request (by each replica's router too)
        return self._alive and not self.wedged

    @property
    def wedged(self) -> bool:
        """Whether the child, once ready, has sent nothing for ``WEDGED_AFTER_S``."""
        heard = self._heard_s
        return heard is not None and time.monotonic() - heard > WEDGED_AFTER_S

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
        timeout_s = self.config.timeout_s(req)
        try:
            self._send(Add(rid, req, timeout_s))
            # the child enforces the deadline; the margin only guards against a stuck child
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s + 2.0)
        except TimeoutError:
            self._send(Abort((rid,)))
            raise E.DeadlineExceeded(f"no answer within {timeout_s:.3f} s") from None
        except asyncio.CancelledError:
            self._send(Abort((rid,)))
            raise
        finally:
            self._pending.pop(rid, None)

    def _send(self, msg: Add | Abort | Stop) -> None:
        conn = self._conn
        if conn is None:
            raise E.EngineStopped("engine is not running")
        try:
            with self._send_lock:
                conn.send(msg)
        except (OSError, ValueError) as e:  # the child is gone
            if isinstance(msg, Add):
                raise E.EngineStopped("engine process is gone") from e

    # ---- the pipe reader (its own thread) ------------------------------------------------------
    def _read(self) -> None:
        assert self._conn is not None and self._loop is not None
        loop, conn = self._loop, self._conn
        try:
            while True:
                msg = conn.recv()
                self._heard_s = time.monotonic()
                if isinstance(msg, Answers):  # a step's answers: one wake-up of the loop
                    loop.call_soon_threadsafe(self._settle_all, msg.answers)
                elif isinstance(msg, Stats):
                    self._on_stats(msg)
                elif isinstance(msg, Ready):
                    self.search_tag = msg.search_tag
                    loop.call_soon_threadsafe(self._set_ready, msg.model_tag, None)
                elif isinstance(msg, Failed):
                    loop.call_soon_threadsafe(self._set_ready, None, E.ModelError(msg.reason))
                elif isinstance(msg, Stopped):
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

    def _settle_all(self, answers: tuple[Answer, ...]) -> None:
        for a in answers:
            fut = self._pending.get(a.req_id)
            if fut is None or fut.done():
                continue
            if a.error is None:
                fut.set_result(a.result)  # type: ignore[arg-type]
            else:
                fut.set_exception(decode_error(a.error))

    def _on_stats(self, msg: Stats) -> None:
        for k, v in msg.stats.items():
            setattr(self.stats, k, v)
        for batch, step_s, tokens in msg.steps:
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


# ---- the child: light imports until it is niced (torch's threads inherit the nice) ----------
def child_main(config: EngineConfig, conn: Connection) -> None:
    """Entry point of the engine process: nice it once, before any other thread exists (a
    thread's nice is its own; the threads started later inherit it), load the model, then
    serve the pipe until told to stop or the parent goes away (``engine.corerun``)."""
    with contextlib.suppress(OSError):
        # the web process answers hits, 429s and health checks in microseconds; under
        # overload it must win the CPU over the engine, not wait behind it
        os.nice(config.engine_nice)
    from chunlian.engine.core import EngineCore
    from chunlian.engine.corerun import CoreLoop

    try:
        core = EngineCore.from_config(config)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which stays not ready
        conn.send(Failed(f"{type(e).__name__}: {e}"))
        return
    core.bind_thread()
    CoreLoop(core, conn).run()
