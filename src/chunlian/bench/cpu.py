"""The CPU meter of ``chunlian bench`` and ``benchmarks/``: process trees and the whole host,
read through psutil.

**A process tree's CPU seconds** (``tree_cpu_seconds``) are the user + system CPU seconds,
all threads, of a process and of every descendant of it, each counted once, whatever the
descendant's state: running, exited but not yet waited for (a zombie keeps its times), or
exited and waited for by its parent in the tree (the parent's ``children_user`` +
``children_system``, which the kernel adds up when it reaps a child). So an engine process
spawned by the server counts as the server's while it runs and after it exits, and the
difference of two readings is what the tree spent between them. Not counted: a descendant
that left the tree before it was waited for (its parent exited first and it was reparented),
and a child reaped between listing the tree and reading its parent (one reading, rarely).

**The host's busy CPU seconds** (``host_busy_seconds``) are the seconds all CPUs spent on
anything but idling or waiting for I/O (user, nice, system, irq, softirq, steal; guest time
is inside user time on Linux): psutil's ``cpu_percent`` counts the same busy time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psutil

CLIENT = "client"  # this process alone (the load generator), all threads
HOST = "host"  # the whole machine, every CPU
OTHER = "other"  # the host's busy time that is neither a measured tree nor this process


def _times_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def tree_cpu_seconds(pid: int) -> float | None:
    """The CPU seconds of the process tree rooted at ``pid`` (the module docstring defines
    them); None when ``pid`` is gone or cannot be read."""
    try:
        root = psutil.Process(pid)
        total = _times_s(root)
        kids = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for kid in kids:
        try:
            total += _times_s(kid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # reaped meanwhile: its time is its parent's children_* from now on
    return total


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process alone (all threads, no children)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def host_busy_seconds() -> float:
    """The CPU seconds all of this host's CPUs have been busy since boot (module docstring)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)  # already inside user
    return sum(t) - idle - guest


def host_busy_cores(window_s: float) -> float:
    """How many cores the whole host kept busy over the next ``window_s`` seconds (blocks)."""
    return psutil.cpu_percent(interval=window_s) / 100 * (os.cpu_count() or 1)


def wait_quiet(limit_s: float, max_cores: float, window_s: float = 5.0) -> float:
    """Wait (up to ``limit_s``) until the host keeps fewer than ``max_cores`` cores busy over
    ``window_s``: other work on the machine would skew a measurement. Returns the busy cores
    of the last window."""
    deadline = time.monotonic() + limit_s
    while True:
        busy = host_busy_cores(window_s)
        if busy <= max_cores or time.monotonic() > deadline:
            return round(busy, 2)


@dataclass
class CpuReading:
    """CPU seconds spent over one window: per named set of trees, ``CLIENT``, ``HOST`` and
    ``OTHER``; a set whose every root was gone at either end holds None."""

    wall_s: float
    seconds: dict[str, float | None]

    def cores(self, digits: int = 2) -> dict[str, float | None]:
        """The seconds divided by the window's length: cores kept busy on average."""
        w = max(self.wall_s, 1e-9)
        return {k: None if v is None else round(v / w, digits) for k, v in self.seconds.items()}


@dataclass
class CpuWindow:
    """Measures CPU seconds from construction (or ``restart``) to ``read``: of each named
    set of process trees (``tree_cpu_seconds`` of each root, summed), of this process
    (``CLIENT``) and of the whole host (``HOST``); ``OTHER`` is the host's busy time left
    over. Roots must not lie inside one another's trees, nor hold this process."""

    trees: Mapping[str, Iterable[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trees = {name: list(pids) for name, pids in self.trees.items()}
        if {CLIENT, HOST, OTHER} & set(self.trees):
            raise ValueError(f"tree names {CLIENT!r}, {HOST!r} and {OTHER!r} are the meter's own")
        self.restart()

    def restart(self) -> None:
        self._t0 = time.perf_counter()
        self._start = self._snapshot()

    def _snapshot(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, pids in self.trees.items():
            vals = [tree_cpu_seconds(p) for p in pids]
            known = [v for v in vals if v is not None]
            out[name] = sum(known) if known else None
        out[CLIENT] = own_cpu_seconds()
        out[HOST] = host_busy_seconds()
        return out

    def read(self) -> CpuReading:
        end = self._snapshot()
        wall = time.perf_counter() - self._t0
        secs: dict[str, float | None] = {}
        for name, v1 in end.items():
            v0 = self._start[name]
            secs[name] = None if v0 is None or v1 is None else max(0.0, v1 - v0)
        measured = sum(v or 0.0 for k, v in secs.items() if k != HOST)
        secs[OTHER] = max(0.0, (secs[HOST] or 0.0) - measured)
        return CpuReading(wall, secs)
