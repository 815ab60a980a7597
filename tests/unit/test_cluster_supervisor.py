"""The cluster's restart policy, on fake children and a fake clock (no processes)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chunlian.cluster.procs import Child
from chunlian.cluster.supervisor import RestartPolicy, Supervisor

_pids = itertools.count(1000)


@dataclass
class FakeProc:
    pid: int = field(default_factory=lambda: next(_pids))
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def child(role: str, name: str, restarts: int = 0) -> Child:
    return Child(role, name, FakeProc(), Path(f"/logs/{name}.log"), None, restarts=restarts)  # type: ignore[arg-type]


class FakeCluster:
    def __init__(self) -> None:
        self.exited: list[Child] = []
        self.respawned: list[Child] = []
        self.stopped = False

    def newly_exited(self) -> list[Child]:
        out, self.exited = self.exited, []
        return out

    def respawn(self, old: Child) -> Child | None:
        if self.stopped:
            return None
        new = child(old.role, old.name, old.restarts + 1)
        self.respawned.append(new)
        return new


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _die(c: Child, code: int = -9) -> Child:
    c.proc.returncode = code  # type: ignore[misc]
    return c


def _setup(**policy: Any) -> tuple[FakeCluster, Clock, list[str], Supervisor]:
    cluster, clock, said = FakeCluster(), Clock(), []
    return cluster, clock, said, Supervisor(cluster, RestartPolicy(**policy), said.append, clock)


def test_an_exited_instance_is_started_again_after_a_doubling_wait() -> None:
    cluster, clock, said, sup = _setup()
    inst = child("instance", "instance-1")
    waits = []
    for _ in range(4):
        cluster.exited.append(_die(inst))
        start = clock.now
        while not (started := sup.tick()):
            assert sup.pending == 1 and sup.pending_role("instance") == 1
            clock.now += 0.25
        waits.append(clock.now - start)
        inst = started[0]
        clock.now += 1.0  # it ran a second before dying again
    assert waits == [1.0, 2.0, 4.0, 8.0]
    assert [c.restarts for c in cluster.respawned] == [1, 2, 3, 4]
    assert "instance-1 (pid" in said[0] and "status -9; starting it again in 1 s" in said[0]
    assert any("started again" in s and "restart 1" in s for s in said)


def test_a_crash_loop_is_left_down_and_old_restarts_leave_the_window() -> None:
    cluster, clock, said, sup = _setup(max_restarts=2, window_s=60.0, max_delay_s=0.0)
    worker = child("worker", "worker-1")
    for _ in range(2):
        cluster.exited.append(_die(worker))
        worker = sup.tick()[0]  # no delay: started at once
    cluster.exited.append(_die(worker))
    assert sup.tick() == [] and sup.pending == 0 and sup.given_up == {"worker-1"}
    assert "stays down" in said[-1] and "/logs/worker-1.log" in said[-1]
    other = child("worker", "worker-2")  # the limit is per child
    cluster.exited.append(_die(other))
    assert len(sup.tick()) == 1
    clock.now = 61.0  # a minute later worker-1's restarts have left the window
    cluster.exited.append(_die(child("worker", "worker-1", restarts=2)))
    assert len(sup.tick()) == 1


def test_nginx_is_never_restarted_and_nothing_starts_after_stop() -> None:
    cluster, clock, said, sup = _setup()
    ng = _die(child("nginx", "nginx"), 1)
    cluster.exited.append(ng)
    assert sup.tick() == [] and sup.pending == 0 and said == [f"nginx (pid {ng.pid}) exited with status 1"]
    cluster.exited.append(_die(child("exporter", "nginx-exporter")))
    sup.tick()
    cluster.stopped = True
    clock.now = 5.0
    assert sup.tick() == [] and sup.pending == 0


@pytest.mark.parametrize("bad", [{"max_restarts": -1}, {"window_s": 0}, {"max_delay_s": -1}])
def test_the_policy_is_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="expected"):
        RestartPolicy(**bad)  # type: ignore[arg-type]
