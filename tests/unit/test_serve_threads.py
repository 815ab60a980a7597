"""Thread settings of the served engine: the default thread count."""

from __future__ import annotations

import os

import pytest

from chunlian.config import load_settings


def test_torch_threads_zero_means_the_cores_at_most_four(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert load_settings(torch_threads=0, warmup="").resolved_torch_threads() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert load_settings(torch_threads=0, warmup="").resolved_torch_threads() == 4
    assert load_settings(torch_threads=3, warmup="").resolved_torch_threads() == 3
