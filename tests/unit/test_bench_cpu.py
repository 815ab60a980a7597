"""The CPU meter (``chunlian.bench.cpu``): a process tree's CPU seconds count every
descendant once, running, exited-but-not-reaped or reaped; the host and window arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from chunlian.bench.cpu import (
    CLIENT,
    HOST,
    OTHER,
    CpuWindow,
    host_busy_cores,
    host_busy_seconds,
    own_cpu_seconds,
    tree_cpu_seconds,
)

BURN_S = 0.3  # CPU seconds each burner spends before it exits
# a child that burns BURN_S of CPU, then exits
BURN = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {BURN_S}: pass\n"
# a child that starts a burner as its own child, waits for it (reaps it), then sleeps
PARENT = ("import subprocess, sys, time\n"
          f"subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n"
          "print('reaped', flush=True)\ntime.sleep(30)\n")


def _wait_zombie(p: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the burner did not finish"
        time.sleep(0.05)


def test_a_child_counts_while_it_runs_as_a_zombie_and_once_reaped() -> None:
    """Exited children are not lost: a zombie keeps its times, and a reaped child's move into
    its parent's children_user/children_system; the reading never falls back."""
    start = tree_cpu_seconds(os.getpid())
    assert start is not None
    p = subprocess.Popen([sys.executable, "-c", BURN])
    _wait_zombie(p)  # exited, not yet waited for
    as_zombie = tree_cpu_seconds(os.getpid())
    p.wait()  # reaped: from now on in this process's children_* times
    reaped = tree_cpu_seconds(os.getpid())
    assert as_zombie is not None and reaped is not None
    assert as_zombie - start >= BURN_S * 0.9
    assert reaped - start >= BURN_S * 0.9
    assert abs(reaped - as_zombie) < 0.1  # counted once, not twice


def test_a_grandchild_reaped_by_its_parent_counts_in_the_tree() -> None:
    p = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"reaped"
        tree = tree_cpu_seconds(p.pid)
        alone = psutil.Process(p.pid).cpu_times()
        assert tree is not None and tree >= BURN_S * 0.9
        assert alone.user + alone.system < BURN_S / 2  # the burner's time, not the parent's own
    finally:
        p.kill()
        p.wait()


def test_a_gone_process_reads_none() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert tree_cpu_seconds(p.pid) is None


def test_host_and_own_seconds() -> None:
    before = own_cpu_seconds()
    sum(i * i for i in range(2_000_000))
    assert own_cpu_seconds() > before
    assert host_busy_seconds() >= own_cpu_seconds()
    assert 0 <= host_busy_cores(0.1) <= (os.cpu_count() or 1)


def test_window_splits_the_host_time_and_says_cores() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        window = CpuWindow({"sleeper": [p.pid]})
        sum(i * i for i in range(2_000_000))  # this process: the client
        reading = window.read()
    finally:
        p.kill()
        p.wait()
    secs = reading.seconds
    assert set(secs) == {"sleeper", CLIENT, HOST, OTHER}
    assert secs[CLIENT] is not None and secs[CLIENT] > 0
    assert secs["sleeper"] is not None and secs["sleeper"] < 0.05
    assert secs[OTHER] is not None and secs[OTHER] >= 0
    cores = reading.cores()
    assert cores[CLIENT] == round(secs[CLIENT] / reading.wall_s, 2)


def test_window_names_are_checked() -> None:
    with pytest.raises(ValueError, match="meter's own"):
        CpuWindow({HOST: [os.getpid()]})
