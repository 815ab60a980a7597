"""Coalescing: identical requests in flight share one generation (``InFlight``), for the
clients of the engine core (``engine.engine.Engine`` in process, ``engine.replicas`` across
processes). Greedy answers are deterministic and seeded ones reproducible, so a second
caller of the same request gets the first one's answer instead of a second batch row.

A merge never gives a caller less than its own request would have had: a caller joins a
request in flight only when that request's priority is at least its own (an interactive
caller never waits under the bulk share, nor gets a bulk search's narrower answer) and its
deadline is no earlier than the caller's own, to within ``DEADLINE_SLACK_SHARE`` of the
caller's timeout (so identical requests a moment apart still merge). Otherwise the caller's
request is sent on its own, and later callers join the newer one. A caller that joined a
request which then ends at its own, earlier deadline still has time of its own: its request
is sent then, with the time it has left, so no merge shortens a caller's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from chunlian.errors import DeadlineExceeded

T = TypeVar("T")
# a caller joins a request whose deadline is at most this share of its own timeout earlier
# than its own (identical requests arriving within it share one generation)
DEADLINE_SLACK_SHARE = 0.05

# what a client's submit gives back: the answer's future, and how to abort the request
Submitted = tuple["asyncio.Future[T]", Callable[[], None]]


@dataclass
class _Shared(Generic[T]):
    future: asyncio.Future[T]
    abort: Callable[[], None]
    bulk: bool  # sent at bulk priority
    deadline_s: float  # when its guard ends, on the event loop's clock
    waiters: int = 1

    def covers(self, bulk: bool, deadline_s: float, slack_s: float) -> bool:
        """Whether a caller with these terms may join: no lower priority, no deadline earlier
        than ``deadline_s`` by more than ``slack_s``."""
        return not self.future.done() and (bulk or not self.bulk) and self.deadline_s >= deadline_s - slack_s


class InFlight(Generic[T]):
    """The requests in flight by key, each with its callers. The request is aborted when
    its last caller goes away (cancelled, or past its deadline guard)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.coalesced = 0  # callers that joined a request already in flight
        self._by_key: dict[Hashable, _Shared[T]] = {}

    async def wait(self, key: Hashable, submit: Callable[[], Submitted[T]], guard_s: float,
                   bulk: bool = False) -> T:
        """The answer for ``key``: joins the request in flight when its terms cover the
        caller's (module docstring), or ``submit``s a new one. ``guard_s`` bounds the wait (the
        core enforces the real deadline, ``guard_s`` less a client's fixed margin; the guard
        only keeps a stuck engine from holding a caller for ever): past it, ``DeadlineExceeded``.
        ``bulk``: the caller's request is at bulk priority."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + guard_s
        shared = self._by_key.get(key) if self.enabled else None
        joined = shared is not None and shared.covers(bulk, deadline_s, DEADLINE_SLACK_SHARE * guard_s)
        if shared is not None and joined:
            shared.waiters += 1
            self.coalesced += 1
        else:
            shared = self._send(key, submit, bulk, deadline_s)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(shared.future), guard_s)
            except DeadlineExceeded:
                left_s = deadline_s - loop.time()
                if not joined or left_s <= 0:
                    raise
            # the joined request ended at its own, earlier deadline: this caller's is ahead
            shared = self._send(key, submit, bulk, deadline_s)
            return await asyncio.wait_for(asyncio.shield(shared.future), left_s)
        except TimeoutError:
            self._leave(key, shared)
            raise DeadlineExceeded(f"no answer within {guard_s:.3f} s") from None
        except asyncio.CancelledError:
            self._leave(key, shared)
            raise

    def _send(self, key: Hashable, submit: Callable[[], Submitted[T]], bulk: bool,
              deadline_s: float) -> _Shared[T]:
        """Submit a caller's own request; later identical callers may join it."""
        future, abort = submit()
        shared = _Shared(future, abort, bulk, deadline_s)
        if self.enabled:  # else nothing ever looks it up
            self._by_key[key] = shared

            def done(_f: asyncio.Future[T]) -> None:
                self._forget(key, shared)

            future.add_done_callback(done)
        return shared

    def _forget(self, key: Hashable, shared: _Shared[T]) -> None:
        if self._by_key.get(key) is shared:
            del self._by_key[key]

    def _leave(self, key: Hashable, shared: _Shared[T]) -> None:
        """A caller went away; the last one aborts the request (a new caller starts anew)."""
        shared.waiters -= 1
        if shared.waiters <= 0 and not shared.future.done():
            self._forget(key, shared)
            shared.abort()
