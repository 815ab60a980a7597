"""Event rates over a sliding window of one-second buckets (O(1) to record, O(window) to read).

The engine uses two: completed requests (its drain rate) and rejected ones (how hard
clients are pushing past a full queue); ``Retry-After`` is derived from both.
"""

from __future__ import annotations


class RateWindow:
    """Events per second over the last ``window_s`` whole seconds of a monotonic clock.

    One writer thread and any number of readers: a reader may see a bucket being reset,
    which only makes one estimate slightly low.
    """

    def __init__(self, window_s: int = 10) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be >= 1, got {window_s}")
        self.window_s = window_s
        self._counts = [0] * window_s
        self._second = [-1] * window_s  # which second each bucket holds
        self._first_s: float | None = None

    def add(self, now_s: float, count: int = 1) -> None:
        sec = int(now_s)
        i = sec % self.window_s
        if self._second[i] != sec:
            self._second[i] = sec
            self._counts[i] = 0
        self._counts[i] += count
        if self._first_s is None:
            self._first_s = now_s

    def count(self, now_s: float) -> int:
        """Events in the window ending at ``now_s`` (the current second included)."""
        oldest = int(now_s) - self.window_s
        return sum(c for c, s in zip(self._counts, self._second, strict=True) if s > oldest)

    def per_s(self, now_s: float) -> float:
        """Events per second over the window, or over the time since the first event when
        that is shorter; 0 while fewer than two events are known."""
        n = self.count(now_s)
        if n < 2 or self._first_s is None:
            return 0.0
        span_s = min(float(self.window_s), now_s - self._first_s)
        return n / max(span_s, 1e-3)
