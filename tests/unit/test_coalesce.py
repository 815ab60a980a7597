"""Coalescing (``engine.coalesce.InFlight``): a merge never shortens a caller's deadline."""

from __future__ import annotations

import asyncio

import pytest

from chunlian.engine.coalesce import InFlight, Submitted
from chunlian.errors import DeadlineExceeded


class _Sends:
    """Each submit's future, in order; ``aborted`` counts aborts."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[str]] = []
        self.aborted = 0

    def submit(self) -> Submitted[str]:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)

        def abort() -> None:
            self.aborted += 1

        return fut, abort


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_caller_whose_joined_request_ends_at_its_earlier_deadline_is_sent_on_its_own() -> None:
    inflight: InFlight[str] = InFlight()
    sends = _Sends()
    first = asyncio.ensure_future(inflight.wait("k", sends.submit, guard_s=10.0))
    await _settle()
    # 0.2 s later by its own deadline, within the merge slack: it joins the first request
    second = asyncio.ensure_future(inflight.wait("k", sends.submit, guard_s=10.2))
    await _settle()
    assert len(sends.futures) == 1 and inflight.coalesced == 1
    sends.futures[0].set_exception(DeadlineExceeded("deadline passed while generating"))
    with pytest.raises(DeadlineExceeded):
        await first
    await _settle()
    assert len(sends.futures) == 2 and not second.done()  # the second caller's own request
    sends.futures[1].set_result("answer")
    assert await second == "answer"


async def test_a_request_that_ends_past_the_callers_own_deadline_is_not_sent_again() -> None:
    inflight: InFlight[str] = InFlight()
    sends = _Sends()
    task = asyncio.ensure_future(inflight.wait("k", sends.submit, guard_s=10.0))
    await _settle()
    sends.futures[0].set_exception(DeadlineExceeded("deadline passed while generating"))
    with pytest.raises(DeadlineExceeded):
        await task
    assert len(sends.futures) == 1


async def test_the_last_caller_to_leave_aborts_the_request() -> None:
    inflight: InFlight[str] = InFlight()
    sends = _Sends()
    task = asyncio.ensure_future(inflight.wait("k", sends.submit, guard_s=0.05))
    with pytest.raises(DeadlineExceeded):
        await task
    assert sends.aborted == 1 and inflight._by_key == {}
