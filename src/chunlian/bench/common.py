"""Small helpers the benchmarks share, free of torch (the load tools must not import it)."""

from __future__ import annotations


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]
