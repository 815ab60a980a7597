"""OpenMP wait policy for processes that share their cores (the service, the job worker).

libgomp's idle threads spin before they sleep: 300,000 rounds by default, several
milliseconds on these CPUs. That is ideal for one process alone and ruinous for two: a
worker's spinning threads took the cores the service's engine needed (interactive p99 14.9x
its alone value with a job worker beside it, and 2.2 bulk items/s). A short spin (10,000
rounds) still bridges most gaps between the ops of one forward pass and sleeps soon after:
p99 3.2-4.2x, 23.6 bulk items/s (30,000 rounds: 8.8x). The price, for a service alone on
its machine: about 6% of miss throughput (three interleaved rounds at c=64: 145 against
155 req/s). Measured with ``benchmarks/jobs_bench.py --colocated``; ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = 10_000


def bound_spin_wait() -> bool:
    """Set ``GOMP_SPINCOUNT`` (unless set) for the OpenMP runtime torch will load. Returns
    False when torch is already imported: the runtime read its environment then."""
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    return "torch" not in sys.modules
