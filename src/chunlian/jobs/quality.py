"""Bulk jobs in the offline quality mode: ``POST /v1/jobs`` with ``"quality": true``.

Operators who print a campaign's couplets want the best lines, not the fastest: the
quality mode (``offline.QUALITY``: the reverse-trained weights' beam of 32, reranked by
their channel score and by the shipped weights) scores BLEU-4 4.15 on the validation split
against the greedy answer's 3.29, at about five times a greedy line's time (docs/MODEL_CARD.md).
Interactive requests keep the greedy engine; a job may ask for the quality mode instead.

* Which items: 下联 items (``upper``) with ``n`` = 1 and no ``seed`` -- the mode searches
  for the one best line. A quality job with any other item is refused at submission
  (``items.N``), so a job never silently mixes the two kinds of answer.
* Where it runs: in a ``chunlian worker`` process (Celery mode), next to the usual model,
  loaded at the first quality item (``QualityModel``); in the embedded mode (no broker), in
  one spawned child process (``QualityProcess``) at ``SCHED_IDLE`` (and niced ``engine_nice
  + worker_nice``): it runs on cores that the event loop and the engine replicas leave idle.
  Beside a miss load it takes much less interactive throughput than niced alone, and the job
  waits while the load lasts (``docs/guides/bulk-jobs.md``, ``docs/performance.md``).
  The quality mode is the shipped pair of weights (``CHUNLIAN_MODEL_PATH`` does not change
  it); a worker on ``--engine-url`` (on a serving machine) loads that pair itself for quality
  items and then runs at ``SCHED_IDLE`` too.
* Sub-batches of ``QUALITY_SUB_BATCH`` items: a search of 32 beams per item is slow, and
  each finished sub-batch is recorded at once, so a chunk cut by its soft time limit loses
  one sub-batch at most (the retry does only what is left).
* Results carry the answering weights' tag (``chunlian-couplet@rev-v3-step5539``), and are not
  put in the interactive result cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import multiprocessing as mp
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


# ---- the embedded mode's child process ---------------------------------------------------------
_child_model: QualityModel | None = None


def _child_init(settings_dump: dict[str, Any]) -> None:
    from chunlian.config import load_settings
    from chunlian.omp import set_spin_wait

    global _child_model
    settings = load_settings(**settings_dump)
    with contextlib.suppress(OSError):
        # below the engine (ENGINE_NICE) as a worker is below the service: interactive work first
        os.nice(min(19, settings.engine_nice + settings.worker_nice))
    run_when_idle()
    set_spin_wait(settings.omp_spin, shared=True)  # before torch loads: it shares the cores
    import torch

    torch.set_num_threads(1)
    _child_model = QualityModel(settings.resolved_device(), settings.generation_blocklist())


def _child_run(specs: list[Spec]) -> list[Answer]:
    assert _child_model is not None
    return _child_model.run(specs)


class QualityProcess:
    """The quality mode in one spawned child process, for the embedded (in-process) jobs.
    Started at the first ``run``; a child that dies is replaced at the next one."""

    def __init__(self, settings_dump: dict[str, Any]) -> None:
        self.settings_dump = settings_dump
        self._pool: cf.ProcessPoolExecutor | None = None

    async def run(self, specs: Sequence[Spec]) -> list[Answer]:
        """Answers for ``specs``; raises when the child fails as a whole (its caller retries)."""
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(1, mp.get_context("spawn"), initializer=_child_init,
                                                initargs=(self.settings_dump,))
        pool = self._pool
        try:
            return await asyncio.wrap_future(pool.submit(_child_run, list(specs)))
        except cf.BrokenExecutor:
            self._pool = None  # the child died (killed, out of memory): a new one next time
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
