"""Job items in the quality mode in a Celery worker: ``POST /v1/jobs`` (``quality``: best,
the default).

The items the quality mode can answer (``jobs.items.searchable``: a 上联 or a composed
couplet, in two stages (``engine.composed``), with ``n`` = 1 and no seed) are marked at
submission; the others are written fast.

* Embedded jobs (no broker) ask the service's engine for ``quality: "best"`` at bulk
  priority (``jobs.inprocess``): the engine's search rows, under the bulk share.
* A ``chunlian worker`` process (Celery mode) runs marked items on the quality mode's own
  generator, loaded next to the usual model at the first such item (``QualityModel``:
  ``offline.OfflineGenerator.load_quality``, the same preset as the engine's best mode); a
  worker on ``--engine-url`` loads that pair itself and runs it at ``SCHED_IDLE``.
* Sub-batches of ``QUALITY_SUB_BATCH`` items: a search of 32 beams per item is slow, and
  each finished sub-batch is recorded at once, so a chunk cut by its soft time limit loses
  one sub-batch at most (the retry does only what is left).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from chunlian.errors import ChunlianError
from chunlian.jobs.items import Spec, request_of
from chunlian.types import CoupletResult

log = logging.getLogger("chunlian.jobs")

QUALITY_SUB_BATCH = 8  # items per quality search (a beam of 32 each: 256 rows)
QUALITY_CAPACITY = 64  # rows of the quality generator (its beam searches 64 // 32 = 2 items at once)
Answer = CoupletResult | ChunlianError


def is_quality(spec: Spec) -> bool:
    """Whether an item is to be answered in the quality mode."""
    return spec.get("quality") is True


class QualityModel:
    """The quality mode's models in this process, loaded at the first ``run``. ``idle``:
    first move this process to ``SCHED_IDLE`` (``run_when_idle``): for a worker that sends
    its other items to a serving instance (``--engine-url``), so on that instance's machine,
    where a model of its own must not take the cores from interactive work."""

    def __init__(self, device: str = "cpu", blocklist: Any = None, idle: bool = False) -> None:
        self.device = device
        self.blocklist = blocklist
        self.idle = idle
        self._gen: Any = None

    def run(self, specs: Sequence[Spec]) -> list[Answer]:
        """One answer per spec, in order (an error object for an item that fails)."""
        if self._gen is None:
            from chunlian.offline import OfflineGenerator

            if self.idle and not run_when_idle():
                log.warning("process %d could not switch to SCHED_IDLE; the quality mode runs at its nice", os.getpid())

            self._gen = OfflineGenerator.load_quality(self.device, QUALITY_CAPACITY, self.blocklist)
            log.info("process %d loaded the quality mode (%s) on %s", os.getpid(), self._gen.loaded.tag,
                     self.device)
        # an exception mid-batch leaves no row in the KV cache (``OfflineGenerator.run``)
        return list(self._gen.generate([request_of(s) for s in specs]))


def run_when_idle() -> bool:
    """Put this process (its calling thread, and threads it starts later) on Linux's
    ``SCHED_IDLE`` policy: it runs only on cores nothing else wants. False where that fails."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True

