"""The service and the job worker bound OpenMP's spin-wait unless told otherwise."""

from __future__ import annotations

import os
import subprocess
import sys


def _spin_after_call(preset: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if preset is not None:
        env["GOMP_SPINCOUNT"] = preset
    code = ("import os, chunlian.omp as o; ok = o.bound_spin_wait(); "
            "print(os.environ['GOMP_SPINCOUNT'], ok)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_spin_count_is_set_before_torch_loads_and_an_explicit_one_wins() -> None:
    assert _spin_after_call(None) == "10000 True"  # chunlian.omp does not import torch
    assert _spin_after_call("300000") == "300000 True"


def test_serving_and_the_worker_command_do_not_import_torch_before_bounding_it() -> None:
    code = "import sys, chunlian.api, chunlian.jobs.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
