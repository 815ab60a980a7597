"""Settlements of request futures, made on the engine thread and handed to the event loop
in one call per engine iteration.

A ``call_soon_threadsafe`` per request would wake the loop for each answer while the
engine thread goes on with the next, and the two would take the interpreter lock from each
other mid-step; settled once per iteration, the loop wakes once per step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Outbox:
    """Settlements queued from any thread (``settle``), run on the event loop by ``flush``."""

    def __init__(self) -> None:
        self._settlements: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def settle(self, future: asyncio.Future[T], result: T | None = None, error: BaseException | None = None) -> None:
        """Queue ``future``'s result (or ``error``); a future already done is left as it is."""

        def settle() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
                future.exception()  # mark retrieved: a cancelled caller may never await it
            else:
                future.set_result(result)  # type: ignore[arg-type]

        with self._lock:
            self._settlements.append(settle)

    def flush(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Hand every queued settlement to ``loop`` in one call (dropped when there is no
        loop, or it is closed)."""
        with self._lock:
            batch, self._settlements = self._settlements, []
        if not batch or loop is None or loop.is_closed():
            return

        def settle_all() -> None:
            for settle in batch:
                settle()

        loop.call_soon_threadsafe(settle_all)
