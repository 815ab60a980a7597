"""The sliding-window rates behind the engine's drain rate and ``Retry-After``."""

from __future__ import annotations

import pytest

from chunlian.engine.rates import RateWindow


def test_rate_over_the_window_and_since_the_first_event() -> None:
    w = RateWindow(10)
    assert w.per_s(100.0) == 0.0
    w.add(100.0)
    assert w.per_s(100.5) == 0.0  # one event says nothing about a rate
    for k in range(1, 40):
        w.add(100.0 + k * 0.25)  # 4 per second for 10 s
    assert w.count(109.9) == 40
    assert w.per_s(109.9) == pytest.approx(40 / 9.9)
    assert w.per_s(150.0) == 0.0  # all of it has left the window


def test_old_buckets_are_reused_not_summed() -> None:
    w = RateWindow(3)
    w.add(10.2, 5)
    w.add(13.1, 2)  # same bucket as second 10, three seconds later
    assert w.count(13.5) == 2
    w.add(14.0)
    assert w.count(14.0) == 3
    with pytest.raises(ValueError, match="window_s"):
        RateWindow(0)
