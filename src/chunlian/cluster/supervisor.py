"""Keeping a started cluster whole: an instance, worker or exporter that exits is started
again, as a process manager would (systemd's ``Restart=on-failure`` with a start limit).

An instance that dies (OOM killer, a crash) would otherwise leave the cluster at part of its
capacity until someone noticed; nginx already sends its traffic to the others, and sends it
back once the new process answers (its ``/readyz`` 503 until warm is retried elsewhere).

Policy (``RestartPolicy``): the n-th restart of a child within ``window_s`` waits
``min(max_delay_s, 2 ** (n - 1))`` seconds; more than ``max_restarts`` in the window is a crash
loop, and that child is left down with one line saying where its log is. nginx is never
restarted here: without it nothing is served, and the launcher stops everything (``cli``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from chunlian.cluster.procs import Child

RESTARTED_ROLES = ("instance", "worker", "exporter")


class Restartable(Protocol):
    """What the supervisor needs of ``launcher.Cluster``."""

    def newly_exited(self) -> list[Child]: ...

    def respawn(self, old: Child) -> Child | None: ...


@dataclass(frozen=True)
class RestartPolicy:
    """When to start an exited child again (module docstring)."""

    max_restarts: int = 5
    window_s: float = 300.0
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0 or self.max_delay_s < 0:
            raise ValueError(f"expected max_restarts >= 0, window_s > 0, max_delay_s >= 0; got {self}")

    def delay_s(self, nth: int) -> float:
        """The wait before the ``nth`` (1-based) restart within the window."""
        return float(min(self.max_delay_s, 2 ** (nth - 1)))


@dataclass
class Supervisor:
    """Call ``tick()`` every fraction of a second while the cluster runs."""

    cluster: Restartable
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    say: Callable[[str], None] = lambda _msg: None
    clock: Callable[[], float] = time.monotonic
    _due: list[tuple[float, Child]] = field(default_factory=list)
    _history: dict[str, list[float]] = field(default_factory=dict)
    given_up: set[str] = field(default_factory=set)

    @property
    def pending(self) -> int:
        """Children waiting for their restart."""
        return len(self._due)

    def pending_role(self, role: str) -> int:
        return sum(1 for _, c in self._due if c.role == role)

    def tick(self) -> list[Child]:
        """Note children that exited, start those whose wait is over; the new children."""
        now = self.clock()
        for child in self.cluster.newly_exited():
            self._exited(child, now)
        started: list[Child] = []
        for when, child in [d for d in self._due if d[0] <= now]:
            self._due.remove((when, child))
            new = self.cluster.respawn(child)
            if new is not None:
                self.say(f"{child.name} started again (pid {new.pid}, restart {new.restarts})")
                started.append(new)
        return started

    def _exited(self, child: Child, now: float) -> None:
        code = child.proc.returncode
        if child.role not in RESTARTED_ROLES:
            self.say(f"{child.name} (pid {child.pid}) exited with status {code}")
            return
        recent = [t for t in self._history.get(child.name, []) if now - t < self.policy.window_s]
        if len(recent) >= self.policy.max_restarts:
            self.given_up.add(child.name)
            self.say(f"{child.name} (pid {child.pid}) exited with status {code}: {len(recent)} restarts in "
                     f"{self.policy.window_s:.0f} s already, so it stays down; its log: {child.log_path}")
            return
        recent.append(now)
        self._history[child.name] = recent
        delay = self.policy.delay_s(len(recent))
        self._due.append((now + delay, child))
        self.say(f"{child.name} (pid {child.pid}) exited with status {code}; starting it again in {delay:g} s")
