"""An engine process whose core fails on purpose (spawned by ``ProcessEngine(child=...)``):
admitting the line ``ADMIT_FAILS`` raises, and a step with the line ``STEP_FAILS`` queued
or running raises, both with exceptions no code path expects; a step with ``STEP_HANGS``
never returns."""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from chunlian.engine.config import EngineConfig
from chunlian.engine.core import EngineCore
from chunlian.engine.corerun import CoreLoop

ADMIT_FAILS = "坏事变成好事"
STEP_FAILS = "天有不测风云"
STEP_HANGS = "一去不复返"  # a step with it never returns (a wedged engine)


def faulty_child_main(config: EngineConfig, conn: Connection) -> None:
    core = EngineCore.from_config(config)
    expand, plan = core._expand, core.scheduler.plan

    def failing_expand(req, tier):  # type: ignore[no-untyped-def]
        if req.upper == ADMIT_FAILS:
            raise ValueError("request needs 32 slots, its pool has 16")
        return expand(req, tier)

    def failing_plan(now_s):  # type: ignore[no-untyped-def]
        uppers = {w.req.request.upper for w in core._work.values()}
        if STEP_FAILS in uppers:
            raise KeyError("a scheduler bug")
        if STEP_HANGS in uppers:
            time.sleep(3600)
        return plan(now_s)

    core._expand = failing_expand  # type: ignore[method-assign]
    core.scheduler.plan = failing_plan  # type: ignore[method-assign]
    core.bind_thread()
    CoreLoop(core, conn).run()
