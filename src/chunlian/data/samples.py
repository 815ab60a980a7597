"""The built-in sample of real 上联 (``resources/sample_uppers.txt``): the load tester's
default lines, the engine benchmark's mix and the int8 calibration set."""

from __future__ import annotations

from importlib import resources


def sample_uppers() -> list[str]:
    """The sample's lines, in file order (comments and blank lines skipped)."""
    text = resources.files("chunlian.resources").joinpath("sample_uppers.txt").read_text(encoding="utf-8")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
