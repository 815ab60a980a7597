"""Small helpers the benchmarks share, free of torch (the load tools must not import it)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


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
