"""No request can end an engine: a search pool narrower than the best search is refused
where the configuration is made, and an unexpected exception at admission or in a step
becomes the error of the requests it touched while the engine goes on serving."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig
from chunlian.errors import ConfigError, ModelError
from chunlian.types import CoupletRequest
from tests.unit.fakes import small_fake_engine


@pytest.mark.parametrize("rows", [1, 16, 31])
def test_a_search_pool_narrower_than_the_best_search_is_refused_where_the_config_is_made(rows: int) -> None:
    with pytest.raises(ConfigError, match="CHUNLIAN_BEAM_ROWS.*at least 32"):
        load_settings(warmup="", beam_rows=rows)
    with pytest.raises(ValueError, match="beam_rows.*at least 32"):
        EngineConfig(beam_rows=rows)
    assert EngineConfig(beam_rows=0).beam_rows == 0 and EngineConfig(beam_rows=32).beam_rows == 32


def test_a_service_with_a_16_row_search_pool_refuses_to_start_with_a_clear_message() -> None:
    env = {"CHUNLIAN_BEAM_ROWS": "16", "CHUNLIAN_PORT": "1", "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "chunlian.cli", "serve"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "CHUNLIAN_BEAM_ROWS" in proc.stderr and "at least 32" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_an_unexpected_exception_at_admission_fails_that_request_and_the_engine_serves_on() -> None:
    eng, _ = small_fake_engine()
    await eng.start()
    add = eng.scheduler.add

    def broken_add(r: object) -> None:
        raise ValueError("request needs 32 slots, its pool has 16")

    try:
        eng.scheduler.add = broken_add  # type: ignore[method-assign]
        with pytest.raises(ModelError, match="admission failed"):
            await eng.generate(CoupletRequest(upper="春回大地"))
        eng.scheduler.add = add  # type: ignore[method-assign]
        assert eng.running
        res = await eng.generate(CoupletRequest(upper="平安喜乐"))
        assert res.best.lower == "乙乙乙乙" and eng.core.has_unfinished is False
    finally:
        await eng.stop()


async def test_an_unexpected_exception_in_a_step_fails_its_requests_and_the_engine_serves_on() -> None:
    eng, runner = small_fake_engine()
    await eng.start()
    plan = eng.scheduler.plan
    calls = {"n": 0}

    def broken_once(now_s: float) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("scheduler bug")
        return plan(now_s)

    try:
        eng.scheduler.plan = broken_once  # type: ignore[method-assign]
        with pytest.raises(ModelError, match="engine step failed"):
            await eng.generate(CoupletRequest(upper="春回大地"))
        assert eng.running
        res = await eng.generate(CoupletRequest(upper="平安喜乐"))
        assert res.best.lower == "乙乙乙乙"
        assert runner.live == {} and eng.scheduler.live_seqs == 0
    finally:
        await eng.stop()
