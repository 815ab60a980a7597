"""Small helpers the benchmarks share, free of torch (the load tools must not import it)."""

from __future__ import annotations

import importlib.util
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

PLOT_EXTRA = "plots need matplotlib: pip install 'chunlian[plot]'"


def can_plot() -> bool:
    """Whether matplotlib (the ``plot`` extra) is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    if not can_plot():
        raise RuntimeError(PLOT_EXTRA)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def mean_fields(records: list[dict[str, Any]], summed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The numeric top-level fields of several runs' records as one: averaged (to 3 decimals),
    or summed for ``summed`` keys; a field some record lacks or holds None becomes None, and
    fields that hold something else (text, lists, mappings) in the first record are left out."""
    out: dict[str, Any] = {}
    for key, first in records[0].items():
        if first is not None and (isinstance(first, bool) or not isinstance(first, int | float)):
            continue
        values = [r.get(key) for r in records]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = None
        elif key in summed:
            out[key] = sum(values)
        else:
            out[key] = round(sum(values) / len(values), 3)  # type: ignore[arg-type]
    return out


def wait_until_ok(
    proc: subprocess.Popen[bytes], url: str, path: str, limit_s: float, what: str,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``url + path`` until it answers 200; raise ``RuntimeError`` naming ``what`` if
    ``proc`` exits first or ``limit_s`` passes (with ``detail()`` appended, e.g. a log tail)."""
    deadline = time.monotonic() + limit_s
    with httpx.Client(base_url=url, timeout=5.0) as c:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}{detail()}")
            try:
                if c.get(path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} was not ready in {limit_s:.0f} s{detail()}")
            time.sleep(0.1)
