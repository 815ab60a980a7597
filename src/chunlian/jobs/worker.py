"""What a Celery worker does with one chunk of a job (no Celery here: unit-testable).

``process_chunk`` runs the chunk's items through an *executor* in sub-batches and writes
each item's result to the store as soon as its sub-batch is done:

* items that already have a result are skipped (a redelivered or retried chunk does only
  what is left; the store's first-write-wins rule covers the rest);
* a cancelled job's items are not run (the API has marked them ``cancelled``);
* each sub-batch counts one try per item *before* it runs, so an item that kills its
  worker is still counted; an item seen again after a lost worker (tries > 0) runs alone,
  so it cannot take its neighbours down with it, and after ``MAX_TRIES`` it is failed
  without being run;
* a sub-batch that raises is re-run one item at a time: a poison item fails alone;
* a permanent error (bad input, a model answer that breaks the rules) fails the item at
  once; a transient one (any exception, the soft time limit) leaves it pending for a
  retry of the chunk with exponential backoff, until its ``MAX_TRIES``-th try, after which
  it is failed with the last error.

Executors: ``LocalExecutor`` (the model in this process, loaded once, ``OfflineGenerator``
at bulk priority) and ``HttpExecutor`` (a serving instance's engine over HTTP: its
``/v1/couplets/batch`` endpoint runs items at ``bulk`` priority). Both send a quality job's
items (``jobs.quality``) to the quality mode's models in this process, in sub-batches of
``QUALITY_SUB_BATCH``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chunlian.errors import ChunlianError, InvalidInput
from chunlian.jobs.items import (
    CANCELLED_ENTRY,
    Entry,
    Spec,
    done_entry,
    failed_entry,
    request_of,
    response_error,
)
from chunlian.jobs.quality import QUALITY_SUB_BATCH, QualityModel, is_quality
from chunlian.jobs.store import JobStore
from chunlian.types import CoupletResult

log = logging.getLogger("chunlian.jobs")

MAX_TRIES = 3  # tries per item, the first included

# ---- hooks around the model calls: none by default; the integration tests install theirs
# before the worker starts (tests/integration/hooked_worker.py: a poison item, a hang, a gate)
def _no_hook(*_: object) -> None:
    return None


@dataclass
class WorkerHooks:
    """Called before each model call (with its specs) and before each sub-batch of a chunk
    (job id, the sub-batch's first item index, the store)."""

    before_run: Callable[[Sequence[Spec]], None] = _no_hook
    between_batches: Callable[[str, int, JobStore], None] = _no_hook


HOOKS = WorkerHooks()  # the pool's processes fork from the worker's: they inherit these


def _hooks_before_run(specs: Sequence[Spec]) -> None:
    HOOKS.before_run(specs)


def _hooks_between_batches(job_id: str, first_index: int, store: JobStore) -> None:
    HOOKS.between_batches(job_id, first_index, store)


# ---- executors ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Transient:
    """A failure worth another try (the message is kept for the final error)."""

    message: str


Outcome = CoupletResult | ChunlianError | Transient


class Executor(Protocol):
    batch_size: int

    def run(self, specs: Sequence[Spec]) -> list[Outcome]:
        """One outcome per spec, in order; raises only for the whole batch."""
        ...


class LocalExecutor:
    """The model in this process (loaded once per worker process); quality items go to the
    quality mode's models (``jobs.quality``, loaded at the first one)."""

    def __init__(self, generator: Any, batch_size: int, quality: Any = None) -> None:
        self.gen = generator
        self.batch_size = batch_size
        self.quality = quality if quality is not None else QualityModel()

    @classmethod
    def from_settings(cls, settings: Any) -> LocalExecutor:
        import torch

        from chunlian.offline import OfflineGenerator

        torch.set_num_threads(settings.torch_threads or 1)
        device = settings.resolved_device()
        gen = OfflineGenerator.load(settings.model_path, device, capacity=settings.max_batch_size,
                                    blocklist=settings.generation_blocklist())
        log.info("worker %d loaded %s on %s", os.getpid(), gen.loaded.tag, device)
        return cls(gen, settings.max_batch_size, QualityModel(device, settings.generation_blocklist()))

    def run(self, specs: Sequence[Spec]) -> list[Outcome]:
        _hooks_before_run(specs)
        return split_run(specs, self._run_plain, self.quality.run)

    def _run_plain(self, specs: Sequence[Spec]) -> list[Outcome]:
        # a failed step is each of its items' error; an exception that escapes the batch
        # leaves no row in the KV cache (``OfflineGenerator.run``)
        return list(self.gen.generate([request_of(s) for s in specs]))


def split_run(specs: Sequence[Spec], plain: Callable[[Sequence[Spec]], Sequence[Outcome]],
              quality: Callable[[Sequence[Spec]], Sequence[Outcome]]) -> list[Outcome]:
    """Run the quality items (``jobs.quality``) and the others each their own way; the
    outcomes in the specs' order."""
    q = [k for k, s in enumerate(specs) if is_quality(s)]
    if not q:
        return list(plain(specs))
    if len(q) == len(specs):
        return list(quality(specs))
    qs = set(q)
    rest = [k for k in range(len(specs)) if k not in qs]
    out: list[Outcome | None] = [None] * len(specs)
    for ks, outcomes in ((q, quality([specs[k] for k in q])), (rest, plain([specs[k] for k in rest]))):
        for k, o in zip(ks, outcomes, strict=True):
            out[k] = o
    return [o for o in out if o is not None]


_TRANSIENT_CODES = {"overloaded", "deadline_exceeded", "engine_stopped", "cancelled", "not_ready",
                    "internal", "client_closed_request"}


class HttpExecutor:
    """A serving instance's engine over HTTP (``/v1/couplets/batch``, bulk priority)."""

    def __init__(self, base_url: str, batch_size: int = 64, timeout_s: float = 60.0,
                 api_key: str | None = None, client: Any = None, blocklist: Any = None) -> None:
        import httpx

        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
        headers = {"X-API-Key": api_key} if api_key else {}
        self.client = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s,
                                             headers=headers)
        self.batch_size = min(batch_size, 256)
        # the serving instance has no quality mode: this process runs it (``jobs.quality``),
        # on the instance's machine, so only on cores the instance leaves idle; ``blocklist``:
        # the bans on its text (``Settings.generation_blocklist``, as the instance's)
        self.quality = QualityModel(blocklist=blocklist, idle=True)

    def run(self, specs: Sequence[Spec]) -> list[Outcome]:
        _hooks_before_run(specs)
        return split_run(specs, self._run_plain, self.quality.run)

    def _run_plain(self, specs: Sequence[Spec]) -> list[Outcome]:
        from chunlian.errors import ModelError
        from chunlian.types import Couplet

        r = self.client.post("/v1/couplets/batch", json={"items": [{**s, "quality": "fast"} for s in specs]})
        if r.status_code != 200:
            # the refusal's words (nginx's rate_limited, when this worker's address is not exempt)
            err = response_error(r)
            raise RuntimeError(f"engine answered HTTP {r.status_code}" + (f": {err[0]}: {err[1]}" if err else ""))
        out: list[Outcome] = []
        for _spec, body in zip(specs, r.json()["results"], strict=True):
            err = body.get("error")
            if err is None:
                cands = tuple(Couplet(c["upper"], c["lower"], c["hengpi"], c["style"])
                              for c in body.get("candidates") or ())
                best = Couplet(body["upper"], body["lower"], body["hengpi"], body["style"])
                out.append(CoupletResult(best, cands, body.get("model", "")))
            elif err.get("code") in _TRANSIENT_CODES:
                out.append(Transient(f"{err.get('code')}: {err.get('message')}"))
            elif err.get("code") == "invalid_input":
                out.append(InvalidInput(err.get("message", "invalid input"), err.get("field")))
            else:
                out.append(ModelError(err.get("message", "generation failed")))
        return out


# ---- one chunk ------------------------------------------------------------------------------
@dataclass
class ChunkReport:
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    skipped: int = 0
    transient: dict[int, str] = field(default_factory=dict)  # index -> last error, still pending


class RetryChunk(Exception):
    """Some items failed transiently and have tries left: retry the chunk (with backoff)."""


def outcome_entry(outcome: Outcome, spec: Spec) -> Entry | None:
    """The stored entry of an outcome; None for a transient failure."""
    if isinstance(outcome, CoupletResult):
        return done_entry(outcome, int(spec.get("n", 1)))
    if isinstance(outcome, InvalidInput):
        return failed_entry(outcome.code, outcome.message, outcome.field)
    if isinstance(outcome, ChunlianError):
        return failed_entry(outcome.code, str(outcome) or outcome.code)
    return None


def _run_isolated(executor: Executor, items: Sequence[tuple[int, Spec]]) -> list[Outcome]:
    """Run a sub-batch; if it raises, run its items one at a time (a poison item alone)."""
    from celery.exceptions import SoftTimeLimitExceeded

    specs = [s for _, s in items]
    try:
        return executor.run(specs)
    except SoftTimeLimitExceeded:
        raise
    except Exception as e:
        if len(items) == 1:
            log.warning("item failed: %s: %s", type(e).__name__, e)
            return [Transient(f"{type(e).__name__}: {e}")]
        log.warning("sub-batch of %d failed (%s: %s); running its items one at a time",
                    len(items), type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
    return [_run_isolated(executor, [it])[0] for it in items]


def _resolve(executor: Any) -> Executor:
    return executor if hasattr(executor, "run") else executor()  # type: ignore[no-any-return]


def process_chunk(
    job_id: str, items: Sequence[tuple[int, Spec]], store: JobStore,
    executor: Executor | Callable[[], Executor], *, final_attempt: bool = False,
) -> ChunkReport:
    """Run what is left of one chunk; raises ``RetryChunk`` when items are left to retry
    (never on the ``final_attempt``: then they are failed with their last error)."""
    from celery.exceptions import SoftTimeLimitExceeded

    report = ChunkReport()
    by_index = {int(i): s for i, s in items}
    pending = store.missing(job_id, list(by_index))
    report.skipped = len(by_index) - len(pending)
    if not pending:
        return report
    if store.is_cancelled(job_id):
        report.cancelled = store.record(job_id, [(i, CANCELLED_ENTRY) for i in pending])
        return report
    prior = store.tries(job_id, pending)
    # a worker died while these ran: each runs alone; past MAX_TRIES they are not run again
    suspects = [i for i in pending if prior.get(i, 0) > 0]
    exhausted = [i for i in suspects if prior[i] >= MAX_TRIES]
    if exhausted:
        report.failed += store.record(job_id, [
            (i, failed_entry("worker_lost", f"tried {prior[i]} times without a result (its worker was "
                             "lost); giving up")) for i in exhausted])
    fresh = [i for i in pending if prior.get(i, 0) == 0]
    ex = _resolve(executor)  # a factory is called only when there is model work to do
    size = max(1, ex.batch_size)
    if any(is_quality(by_index[i]) for i in fresh):  # slow searches: record every few
        size = min(size, QUALITY_SUB_BATCH)
    batches = [[i] for i in suspects if i not in exhausted]
    batches += [fresh[k:k + size] for k in range(0, len(fresh), size)]
    last_error = "soft time limit exceeded"
    left: list[int] = []
    try:
        for n, batch in enumerate(batches):
            left = [i for b in batches[n:] for i in b]
            store.begin_attempt(job_id, batch)
            _hooks_between_batches(job_id, min(batch), store)
            if store.is_cancelled(job_id):
                report.cancelled += store.record(job_id, [(i, CANCELLED_ENTRY) for i in left])
                left = []
                break
            outcomes = _run_isolated(ex, [(i, by_index[i]) for i in batch])
            writes: list[tuple[int, Entry]] = []
            for i, outcome in zip(batch, outcomes, strict=True):
                entry = outcome_entry(outcome, by_index[i])
                if entry is None:
                    report.transient[i] = outcome.message if isinstance(outcome, Transient) else str(outcome)
                else:
                    writes.append((i, entry))
                    report.done += int(entry["status"] == "done")
                    report.failed += int(entry["status"] == "failed")
            store.record(job_id, writes)
        left = []
    except SoftTimeLimitExceeded:
        log.warning("job %s: chunk past its soft time limit; %d items left for a retry", job_id, len(left))
        for i in left:
            report.transient.setdefault(i, last_error)
    if not report.transient:
        return report
    tries = store.tries(job_id, list(report.transient))
    give_up = [i for i in report.transient if final_attempt or tries.get(i, 0) >= MAX_TRIES]
    if give_up:
        report.failed += store.record(job_id, [
            (i, failed_entry("item_failed", f"failed after {max(tries.get(i, 0), 1)} tries: "
                             f"{report.transient[i]}")) for i in give_up])
    if len(give_up) < len(report.transient):
        raise RetryChunk(f"{len(report.transient) - len(give_up)} items of job {job_id} left to retry")
    return report


def fail_remaining(job_id: str, indices: Sequence[int], store: JobStore, code: str, message: str) -> int:
    """Fail every item of ``indices`` that has no result (a chunk that will not run again)."""
    left = store.missing(job_id, indices)
    return store.record(job_id, [(i, failed_entry(code, message)) for i in left]) if left else 0
