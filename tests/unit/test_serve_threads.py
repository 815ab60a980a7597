"""Thread settings of the served engine: the default thread count, and sleeping idle threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chunlian.config import load_settings


def test_torch_threads_zero_means_the_cores_at_most_four(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert load_settings(torch_threads=0, warmup="").resolved_torch_threads() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert load_settings(torch_threads=0, warmup="").resolved_torch_threads() == 4
    assert load_settings(torch_threads=3, warmup="").resolved_torch_threads() == 3


def _policy_after_call(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    code = ("import os, chunlian.api as a; ok = a.prefer_sleeping_threads(); "
            "print(os.environ['OMP_WAIT_POLICY'], ok)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_serving_makes_idle_threads_sleep_unless_told_otherwise() -> None:
    # a fresh interpreter: chunlian.api does not import torch, so the setting takes effect
    assert _policy_after_call(None) == "PASSIVE True"
    assert _policy_after_call("ACTIVE") == "ACTIVE True"
