"""Hot lines: requests asked more than once whose answer is not yet the best mode's.

The service notes every answer that ``best`` did not write (``fast`` or ``good``, fresh or
cached) under the key its best answer would be cached with; the idle upgrade
(``api.upgrade``) takes the most asked line first, re-answers it in the best mode and
replaces the cached answer. Pure Python, no I/O, used on the event loop only.

The table is bounded: past ``max_lines`` it forgets the least asked half, so a flood of
lines asked once (a New Year's Eve peak) never grows it, and the lines asked most survive.
"""

from __future__ import annotations

from dataclasses import dataclass

from chunlian.types import CoupletRequest


@dataclass
class HotLine:
    """A line's cache key (its best answer's), the request as first asked, and how often
    it was answered below the best mode."""

    key: str
    request: CoupletRequest
    asked: int = 1


class HotLines:
    """The lines answered below the best mode, by how often (module docstring)."""

    def __init__(self, max_lines: int = 10_000, min_asked: int = 2) -> None:
        if max_lines < 1:
            raise ValueError(f"max_lines must be at least 1, got {max_lines}")
        if min_asked < 1:
            raise ValueError(f"min_asked must be at least 1, got {min_asked}")
        self.max_lines = max_lines
        self.min_asked = min_asked
        self._lines: dict[str, HotLine] = {}

    def __len__(self) -> int:
        return len(self._lines)

    @property
    def pending(self) -> int:
        """Lines asked at least ``min_asked`` times: what an upgrade would take."""
        return sum(1 for h in self._lines.values() if h.asked >= self.min_asked)

    def asked(self, key: str, request: CoupletRequest) -> None:
        """A request whose best answer is cached under ``key`` was answered below best."""
        line = self._lines.get(key)
        if line is not None:
            line.asked += 1
            return
        self._lines[key] = HotLine(key, request)
        if len(self._lines) > self.max_lines:
            self._forget_half()

    def upgraded(self, key: str) -> None:
        """The line's best answer is cached now: it is no longer hot."""
        self._lines.pop(key, None)

    def take(self) -> HotLine | None:
        """Remove and return the most asked line (asked at least ``min_asked`` times;
        the earliest noted among equals), or None."""
        best: HotLine | None = None
        for line in self._lines.values():
            if line.asked >= self.min_asked and (best is None or line.asked > best.asked):
                best = line
        if best is not None:
            del self._lines[best.key]
        return best

    def put_back(self, line: HotLine) -> None:
        """Return a line taken and not upgraded (the upgrade gave way to live requests),
        with the asks it had and those that came meanwhile."""
        now = self._lines.get(line.key)
        line.asked += now.asked if now is not None else 0
        self._lines[line.key] = line

    def _forget_half(self) -> None:
        keep = sorted(self._lines.values(), key=lambda h: h.asked, reverse=True)[: self.max_lines // 2]
        self._lines = {h.key: h for h in keep}
