"""OpenMP's spin-wait: full for a service alone, bounded for processes sharing the cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chunlian.cluster.commands import spin_env
from chunlian.config import load_settings
from chunlian.errors import ConfigError


def _spin_after(call: str, preset: str | None) -> str:
    """``GOMP_SPINCOUNT`` after ``call`` in a fresh interpreter (``-`` when unset), and its
    return value (True: torch was not imported yet)."""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if preset is not None:
        env["GOMP_SPINCOUNT"] = preset
    code = (f"import os, chunlian.omp as o; ok = o.{call}; "
            "print(os.environ.get('GOMP_SPINCOUNT', '-'), ok)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@pytest.mark.parametrize(("call", "expected"), [
    ("set_spin_wait('auto', shared=False)", "- True"),  # chunlian serve: libgomp's own
    ("set_spin_wait('auto', shared=True)", "10000 True"),  # chunlian worker
    ("set_spin_wait('full', shared=True)", "- True"),
    ("set_spin_wait('bounded', shared=False)", "10000 True"),
])
def test_the_policy_decides_the_spin_count_before_torch_loads(call: str, expected: str) -> None:
    assert _spin_after(call, None) == expected  # True: chunlian.omp does not import torch


def test_an_explicit_gomp_spincount_always_wins() -> None:
    assert _spin_after("set_spin_wait('bounded', shared=True)", "300000") == "300000 True"
    assert _spin_after("set_spin_wait('full', shared=False)", "77") == "77 True"


def test_the_setting_is_validated_where_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUNLIAN_OMP_SPIN", "bounded")
    assert load_settings().omp_spin == "bounded"
    monkeypatch.setenv("CHUNLIAN_OMP_SPIN", "spinny")
    with pytest.raises(ConfigError, match="CHUNLIAN_OMP_SPIN"):
        load_settings()


def test_cluster_instances_sharing_a_machine_get_a_bounded_spin() -> None:
    assert spin_env({}, instances=2, workers=0) == {"CHUNLIAN_OMP_SPIN": "bounded"}
    assert spin_env({}, instances=1, workers=1) == {"CHUNLIAN_OMP_SPIN": "bounded"}
    assert spin_env({}, instances=1, workers=0) == {}  # alone: as chunlian serve
    assert spin_env({"CHUNLIAN_OMP_SPIN": "full"}, instances=3, workers=2) == {}  # told: kept


def test_serving_and_the_worker_command_do_not_import_torch_before_setting_it() -> None:
    code = "import sys, chunlian.api, chunlian.jobs.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
