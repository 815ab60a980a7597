"""CPU time of a local process tree and of the whole host, from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 onwards


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its live descendants (all threads;
    an engine process spawned by the server counts as the server's), from /proc; None when
    unreadable (another OS, or the process is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in process_tree(pid):
        f = fields if p == pid else _stat_fields(p)
        if f is not None:
            total += (int(f[11]) + int(f[12])) / ticks  # utime, stime: fields 14 and 15
    return total


def process_tree(pid: int) -> set[int]:
    """``pid`` and its live descendants (children, their children, ...), from /proc."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            f = _stat_fields(int(entry.name))
            if f is not None:
                parent[int(entry.name)] = int(f[1])  # ppid: field 4
    tree, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return tree


def thread_cpu_seconds(pid: int, tid: int) -> float | None:
    """User + system CPU seconds of one thread (``tid == pid``: the main thread)."""
    f = _stat_fields(pid, tid)
    return None if f is None else (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _host_ticks() -> list[int] | None:
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal


def host_cpu_seconds() -> float | None:
    """CPU seconds the whole host has been busy (all CPUs, /proc/stat); None elsewhere."""
    t = _host_ticks()
    if t is None:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = t
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def host_steal_seconds() -> float | None:
    """CPU seconds the hypervisor gave to others while this host's CPUs wanted to run."""
    t = _host_ticks()
    return None if t is None else t[7] / os.sysconf("SC_CLK_TCK")
