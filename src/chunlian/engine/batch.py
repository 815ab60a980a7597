"""Running a batch of requests through an engine core to the end, on the calling thread
(the in-process client's loop: ``offline.OfflineGenerator``)."""

from __future__ import annotations

from dataclasses import replace

from chunlian.engine.core import CoreOutput, CoreRequest, EngineCore
from chunlian.errors import ChunlianError, ModelError
from chunlian.types import CoupletRequest


def run_batch(core: EngineCore, requests: list[CoupletRequest], window: int) -> list[CoreOutput]:
    """Each request's output from ``core``, in input order (an error output for a request the
    core refuses). Requests enter the core as rows free up, at most ``window`` queued at a
    time (enough for every free row to be filled at each step, few enough that the
    scheduler's scans stay short). Requests run without a deadline."""
    outs: list[CoreOutput | None] = [None] * len(requests)
    nxt = 0
    try:
        while nxt < len(requests) or core.has_unfinished:
            while nxt < len(requests) and core.queue_depth < window:
                try:
                    core.add_request(CoreRequest(nxt, replace(requests[nxt], timeout_s=None)))
                except ChunlianError as e:
                    outs[nxt] = CoreOutput(nxt, error=e)
                nxt += 1
            for out in core.step():
                outs[out.req_id] = out
    finally:  # an exception mid-batch leaves no request, and no row, behind
        if core.has_unfinished:
            core.fail_all(ModelError("generation interrupted"))
    return [o if o is not None else CoreOutput(i, error=ModelError("no answer")) for i, o in enumerate(outs)]
