"""The engine process's main loop: an ``EngineCore`` driven straight from the pipe, on the
process's one thread, with no event loop (``engine.process.child_main`` runs it).

Each turn takes every message waiting on the pipe, runs one core step and sends the
requests that ended as one ``Answers`` message. With nothing to run, the loop sleeps on the
pipe until a message comes, the core's wait for companions ends, or stats are due.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from multiprocessing.connection import Connection

from chunlian.engine.core import CoreOutput, CoreRequest, EngineCore
from chunlian.engine.messages import (
    Abort,
    Add,
    Answer,
    Answers,
    Ready,
    Stats,
    Stop,
    Stopped,
    encode_error,
)
from chunlian.errors import ChunlianError, EngineStopped, ModelError

log = logging.getLogger("chunlian.engine")
STATS_EVERY_S = 0.25


class CoreLoop:
    """One core behind one pipe (module docstring)."""

    def __init__(self, core: EngineCore, conn: Connection) -> None:
        self.core = core
        self.conn = conn
        self.steps: list[tuple[int, float, int]] = []
        core.add_step_listener(lambda r: self.steps.append((r.batch_size, r.step_s, r.tokens)))
        self._stats_due = 0.0

    def run(self) -> None:
        self.conn.send(Ready(self.core.model_tag, self.core.search_tag))
        try:
            while self._turn():
                pass
        except (EOFError, OSError):  # the parent is gone: nothing to answer
            return
        except Exception:  # a core failure: every request fails, the parent sees the exit
            log.exception("engine loop failed")
            self._answer(self.core.fail_all(EngineStopped("engine failed")))
            return
        self._answer(self.core.fail_all(EngineStopped("engine stopped")))
        with contextlib.suppress(OSError):
            self._send_stats(time.monotonic())
            self.conn.send(Stopped())

    def _turn(self) -> bool:
        """One turn; False once told to stop."""
        now = time.monotonic()
        idle_s = self.core.idle_wait_s
        wait_s = 0.0 if idle_s is None else min(idle_s, max(0.0, self._stats_due - now))
        if self.conn.poll(wait_s):
            while True:
                if not self._apply(self.conn.recv()):
                    return False
                if not self.conn.poll(0):
                    break
        self._answer(self.core.step())
        now = time.monotonic()
        if now >= self._stats_due:
            self._send_stats(now)
        return True

    def _apply(self, msg: object) -> bool:
        if isinstance(msg, Add):
            try:
                self.core.add_request(CoreRequest(msg.req_id, msg.request, time.monotonic() + msg.timeout_s))
            except ChunlianError as e:
                self._answer([CoreOutput(msg.req_id, error=e)])
            except Exception as e:  # noqa: BLE001 - a request never ends the engine process
                log.exception("admission failed")
                self._answer([CoreOutput(msg.req_id, error=ModelError(f"admission failed: {type(e).__name__}"))])
        elif isinstance(msg, Abort):
            self.core.abort(msg.req_ids)
        elif isinstance(msg, Stop):
            return False
        return True

    def _answer(self, outputs: list[CoreOutput]) -> None:
        if outputs:
            self.conn.send(Answers(tuple(
                Answer(o.req_id, o.result, None if o.error is None else encode_error(o.error)) for o in outputs)))

    def _send_stats(self, now: float) -> None:
        steps, self.steps = tuple(self.steps), []
        self.conn.send(Stats(dataclasses.asdict(self.core.stats), steps))
        self._stats_due = now + STATS_EVERY_S
