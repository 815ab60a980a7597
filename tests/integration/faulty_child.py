"""An engine process whose core fails on purpose (spawned by ``ProcessEngine(child=...)``):
admitting the line ``ADMIT_FAILS`` raises, and a step with the line ``STEP_FAILS`` queued
or running raises, both with exceptions no code path expects."""

from __future__ import annotations

from multiprocessing.connection import Connection

from chunlian.engine.config import EngineConfig
from chunlian.engine.core import EngineCore
from chunlian.engine.corerun import CoreLoop

ADMIT_FAILS = "坏事变成好事"
STEP_FAILS = "天有不测风云"


def faulty_child_main(config: EngineConfig, conn: Connection) -> None:
    core = EngineCore.from_config(config)
    expand, plan = core._expand, core.scheduler.plan

    def failing_expand(req, tier):  # type: ignore[no-untyped-def]
        if req.upper == ADMIT_FAILS:
            raise ValueError("request needs 32 slots, its pool has 16")
        return expand(req, tier)

    def failing_plan(now_s):  # type: ignore[no-untyped-def]
        if any(w.req.request.upper == STEP_FAILS for w in core._work.values()):
            raise KeyError("a scheduler bug")
        return plan(now_s)

    core._expand = failing_expand  # type: ignore[method-assign]
    core.scheduler.plan = failing_plan  # type: ignore[method-assign]
    core.bind_thread()
    CoreLoop(core, conn).run()
