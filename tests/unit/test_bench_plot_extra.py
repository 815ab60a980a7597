"""Plots need matplotlib only through the ``plot`` extra: without it the load tools still
measure and write their tables, and asking for a plot is a usage error naming the extra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunlian.bench import common, http, sweep
from chunlian.cli import main


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in (common, http, sweep):
        monkeypatch.setattr(mod, "can_plot", lambda: False)


def test_sweep_outputs_without_matplotlib_have_no_plot(tmp_path: Path, no_matplotlib: None) -> None:
    rows = [{"max_batch_size": b, "max_wait_ms": 0.0, "requests_per_s": 10.0 * b, "p99_ms": 100.0,
             "errors": 0, "error_rate": 0.0} for b in (1, 8)]
    paths = sweep.write_outputs(rows, tmp_path, {"title": "t"}, 1000.0)
    assert set(paths) == {"md", "json"} and not (tmp_path / "sweep.png").exists()
    assert json.loads(paths["json"].read_text(encoding="utf-8"))["best"]["max_batch_size"] == 8


def test_asking_for_a_plot_without_matplotlib_names_the_extra(
        no_matplotlib: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "http", "--plot", "x.png", "--duration-s", "1"]) == 2
    assert "chunlian[plot]" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match=r"chunlian\[plot\]"):
        common.pyplot()
