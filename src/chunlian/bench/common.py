"""Small helpers the benchmarks share, free of torch (the load tools must not import it)."""

from __future__ import annotations

import importlib.util
from typing import Any

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
    """The ``q``-th percentile (0-100) by nearest rank: of the sorted sample, the element at
    ``round(q / 100 * (n - 1))`` (halves round to even); 0 without a sample. The one
    percentile of ``chunlian bench`` and ``benchmarks/``."""
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
