"""``chunlian worker`` with the test hooks installed (``chunlian.jobs.worker.HOOKS``), each
active only when its variable is set in the worker's environment:

* ``CHUNLIAN_TEST_POISON=1``: the model call raises on ``POISON_TEXT`` (an input that
  crashes it);
* ``CHUNLIAN_TEST_HANG=1``: the model call hangs on ``HANG_TEXT``, ignoring the soft limit
  (a stuck native call: only the hard time limit ends it);
* ``CHUNLIAN_TEST_GATE=<redis key>``: every sub-batch but a job's first waits (up to 120 s)
  while that key exists in the store's Redis;
* ``CHUNLIAN_TEST_DELAY_S``: a sleep before each sub-batch.

    python -m tests.integration.hooked_worker worker --concurrency 1
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from chunlian.jobs import worker
from chunlian.jobs.items import Spec, spec_text
from chunlian.jobs.store import JobStore

POISON_TEXT = "毒药毒药毒药毒"
HANG_TEXT = "长眠不醒长眠不醒"


class PoisonError(RuntimeError):
    """Raised by the poison hook."""


def before_run(specs: Sequence[Spec]) -> None:
    texts = {spec_text(s) for s in specs}
    if os.environ.get("CHUNLIAN_TEST_POISON") == "1" and POISON_TEXT in texts:
        raise PoisonError("test poison item")
    if os.environ.get("CHUNLIAN_TEST_HANG") == "1" and HANG_TEXT in texts:
        from celery.exceptions import SoftTimeLimitExceeded

        while True:
            try:
                time.sleep(3600)
            except SoftTimeLimitExceeded:
                continue


def between_batches(job_id: str, first_index: int, store: JobStore) -> None:
    gate = os.environ.get("CHUNLIAN_TEST_GATE")
    r = getattr(store, "r", None)
    if gate and r is not None and first_index > 0:
        deadline = time.monotonic() + 120
        while r.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
    delay = float(os.environ.get("CHUNLIAN_TEST_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)


if __name__ == "__main__":
    from chunlian.cli import main

    worker.HOOKS = worker.WorkerHooks(before_run=before_run, between_batches=between_batches)
    sys.exit(main(sys.argv[1:]))
