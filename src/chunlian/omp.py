"""OpenMP wait policy: how long torch's idle OpenMP threads spin before they sleep.

libgomp's idle threads spin 300,000 rounds by default, several milliseconds on these
CPUs. That is best for one process alone on its cores and ruinous for two model-running
processes sharing them: a job worker's spinning threads take the cores the service's engine
needs, and the service's p99 grows many times over. A bounded spin (10,000 rounds) still
bridges most gaps between the ops of one forward pass and sleeps soon after; it costs a
service alone on its machine some of its miss throughput. The figures of both, and how to
measure them (``benchmarks/jobs_bench.py --colocated``, ``chunlian bench service``), are in
``docs/performance.md`` ("Measurements behind the code"). So each process picks
(``Settings.omp_spin``, ``auto`` by default):

* ``chunlian serve``: libgomp's own spin (a service alone on its cores, the deployment
  ``docs/guides/deploy.md`` recommends);
* ``chunlian worker`` and the instances ``chunlian cluster`` starts on one machine: bounded
  (they share the cores with other model-running processes).

A ``GOMP_SPINCOUNT`` already in the environment is always left as it is.

``usable_cores`` gives the CPUs this process may run on, which thread counts are sized to.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

SPIN_COUNT = 10_000

SpinPolicy = Literal["auto", "full", "bounded"]


def set_spin_wait(policy: SpinPolicy, shared: bool) -> bool:
    """Apply ``policy`` (``auto``: bounded when ``shared``, i.e. when this process shares its
    cores with other model-running processes) to the OpenMP runtime torch will load. Returns
    False when torch is already imported: the runtime read its environment then."""
    if policy == "bounded" or (policy == "auto" and shared):
        os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    return "torch" not in sys.modules


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
