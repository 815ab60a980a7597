"""``EngineCore``: the one synchronous core that runs every way of writing a couplet.

Greedy, sampled (``n``, ``seed``), composed (藏头 / keyword) and beam requests (width, with
optional channel and forward rescoring) are request kinds of one continuous batch over one
KV cache: a beam's rows decode in the same forward pass as other requests' rows, and the
rescoring of beams that finished is batched forward work the core runs in the same step.

With a search runner (``from_config`` loads one when ``EngineConfig.beam_rows`` > 0), the
core serves the quality modes (``engine.tiers``): best and good searches run on the
reverse-trained weights' runner, in a row pool of their own, stepped together with the main
runner's rows; their lines are reranked by the search weights' channel score and the served
weights' forward score. ``auto`` requests get their mode when the scheduler admits them.

The core has no thread, no event loop and no clock of its own beyond ``time.monotonic``:

    add_request(CoreRequest)   queue a request (raises Overloaded, InvalidInput or ModelError at once)
    abort(req_ids)             cancel requests, queued or running (idempotent)
    step() -> [CoreOutput]     plan, run one model step, return the requests that ended (never raises)

Every request added ends in exactly one ``CoreOutput``: a result, or an error (deadline,
cancellation, model failure, shutdown through ``fail_all``). Clients (``engine.engine``'s
async ``Engine``, ``offline.OfflineGenerator``) own futures, coalescing and transport.
The scheduler (``engine.scheduler``, pure Python) owns admission, priority and the bulk
share; the runner (``engine.runner``) owns the tensors.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from chunlian.engine.config import EngineConfig
from chunlian.engine.coreapi import CoreOutput, CoreRequest, Runner
from chunlian.engine.rates import RateWindow
from chunlian.engine.request import BeamHyp, SeqOutput, SeqSpec, expand
from chunlian.engine.rerank import HengpiChooser, build_result, searched_lines
from chunlian.engine.rescore import BeamJob, Rescorer
from chunlian.engine.scheduler import (
    Hopeless,
    QueueFull,
    SchedRequest,
    Scheduler,
    SchedulerConfig,
    Unreachable,
)
from chunlian.engine.stats import EngineStats, StepReport
from chunlian.engine.tiers import BEST, SEARCH_OF, StepDown, core_tier, served_of
from chunlian.errors import (
    Cancelled,
    ChunlianError,
    DeadlineExceeded,
    InvalidInput,
    ModelError,
    Overloaded,
)
from chunlian.types import BeamParams, CoupletRequest, CoupletResult, Served

__all__ = ["CoreOutput", "CoreRequest", "EngineCore", "Runner"]  # the interface: engine.coreapi

RATE_WINDOW_S = 10  # the completion rate is measured over this many seconds

log = logging.getLogger("chunlian.engine")


@dataclass
class _Work:
    req: CoreRequest
    specs: list[SeqSpec]  # empty until admitted for an ``auto`` request (its mode decides)
    tier: Served | None = None  # the mode that answers it, once known
    outputs: list[SeqOutput] = field(default_factory=list)
    aborted: bool = False

    @property
    def beam(self) -> BeamParams | None:
        """The search it runs, if any."""
        return self.specs[0].beam if self.specs else None


class EngineCore:
    """Continuous (or static) batching of every request kind; see the module docstring."""

    def __init__(
        self, config: EngineConfig, runner: Runner, hengpi: HengpiChooser | None = None,
        model_tag: str = "chunlian-couplet@dev", rescorer: Rescorer | None = None,
        search_runner: Runner | None = None, search_tag: str | None = None,
    ) -> None:
        if config.max_batch_size > runner.capacity:
            raise ValueError(f"runner capacity {runner.capacity} < max_batch_size {config.max_batch_size}")
        if search_runner is not None and (rescorer is None or search_runner.capacity < config.beam_rows
                                          or config.beam_rows < BEST.width):
            raise ValueError(f"a search runner needs a rescorer and beam_rows (at least {BEST.width}) of capacity")
        self.config = config
        self.runner = runner
        self.search_runner = search_runner
        self.runners = (runner,) if search_runner is None else (runner, search_runner)
        for r in self.runners:
            r.padded_batches = config.batching == "static"
        self.hengpi = hengpi
        self.model_tag = model_tag
        # a searched answer names the weights that wrote it (the search runner's, when there is one)
        self.search_tag = search_tag or model_tag
        self.rescorer = rescorer
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms,
            max_queue_size=config.max_queue_size, batching=config.batching,
            bulk_min_share=config.bulk_min_share, min_prefill_seqs=config.min_prefill_seqs,
            beam_rows=config.beam_rows if search_runner is not None else 0,
            step_down=StepDown(config.step_down_wait_share),
        ))
        self.stats = EngineStats(max_queue_size=config.max_queue_size)
        self.idle_wait_s: float | None = None  # after a step with nothing to run: how long to wait
        self._work: dict[int, _Work] = {}
        self._seq_owner: dict[int, int] = {}
        self._seq_ids = itertools.count(1)
        self._done = RateWindow(RATE_WINDOW_S)
        self._listeners: list[Callable[[StepReport], None]] = []
        self._out: list[CoreOutput] = []

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        """Load the models ``config`` names (``engine.build``) and build a core around them."""
        from chunlian.engine.build import load_parts

        p = load_parts(config)
        return cls(config, p.runner, p.hengpi, p.model_tag, p.rescorer, p.search_runner, p.search_tag)

    def bind_thread(self) -> None:
        """Called on the stepping thread before its first step (``ModelRunner.bind_thread``)."""
        for r in self.runners:
            r.bind_thread()

    # ---- inputs -----------------------------------------------------------------------------
    def add_request(self, creq: CoreRequest) -> None:
        """Queue ``creq``; raises ``Overloaded`` (queue full), ``InvalidInput`` or, for an
        unexpected failure of its admission, ``ModelError`` at once, and then the request
        never produces an output. No request can break the core: an admission that fails
        leaves nothing of it behind."""
        if creq.req_id in self._work:
            raise ValueError(f"request id {creq.req_id} is already live")
        try:
            self._add(creq)
        except ChunlianError:
            raise
        except Exception as e:
            log.exception("admission failed")
            self._forget(creq.req_id)
            raise ModelError(f"admission failed: {type(e).__name__}") from None

    def _forget(self, req_id: int) -> None:
        """Undo whatever a failed admission of ``req_id`` left (the scheduler drops it)."""
        w = self._work.pop(req_id, None)
        for s in w.specs if w is not None else ():
            self._seq_owner.pop(s.seq_id, None)
        self.scheduler.cancel(req_id)

    def _add(self, creq: CoreRequest) -> None:
        req = creq.request
        rows = req.params.rows
        if rows > self.config.max_batch_size:
            raise InvalidInput(f"n must be at most {self.config.max_batch_size}", "n")
        if req.params.beam is not None and self.rescorer is None and req.params.beam.reranked:
            raise InvalidInput("this engine has no weights to rescore beams with", "beam")
        tier = core_tier(req, self.search_runner is not None)
        specs = self._expand(req, tier) if tier is not None else []
        now = time.monotonic()
        try:
            self.scheduler.add(SchedRequest(creq.req_id, req.priority, rows, now, creq.deadline_s, tier=tier))
        except QueueFull:
            self.stats.rejected += 1
            raise Overloaded(f"queue full ({self.config.max_queue_size} waiting)", 1.0) from None
        except Hopeless as e:  # no retry can help: say why, and what would
            self.stats.rejected += 1
            raise InvalidInput(f"{e}; give a longer timeout_ms or ask for quality auto", "timeout_ms") from None
        except Unreachable as e:
            self.stats.rejected += 1
            raise Overloaded(f"the best mode cannot answer within the deadline ({e})",
                             max(1.0, e.wait_s)) from None
        self._work[creq.req_id] = w = _Work(creq, [])
        self._assign(w, specs, tier)
        self.stats.queue_depth = self.scheduler.queue_depth

    def _expand(self, req: CoupletRequest, tier: Served) -> list[SeqSpec]:
        """``req``'s sequences as ``tier`` writes them (``request.expand``)."""
        search = SEARCH_OF.get(tier)
        if search is not None and req.params.beam is None:
            req = replace(req, params=replace(req.params, beam=search))
        try:
            specs = expand(req, next(self._seq_ids))
        except ValueError as e:
            raise InvalidInput(str(e), "beam") from None
        for _ in range(len(specs) - 1):
            next(self._seq_ids)
        return specs

    def _assign(self, w: _Work, specs: list[SeqSpec], tier: Served | None) -> None:
        w.specs, w.tier = specs, tier
        for s in specs:
            self._seq_owner[s.seq_id] = w.req.req_id

    def abort(self, req_ids: Iterable[int]) -> None:
        """Cancel requests: each ends with ``Cancelled`` at the next step (unknown or ended
        ids are ignored)."""
        for rid in req_ids:
            w = self._work.get(rid)
            if w is not None:
                w.aborted = True
                self.scheduler.cancel(rid)

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        self._listeners.append(fn)

    # ---- state --------------------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return bool(self._work)

    @property
    def queue_depth(self) -> int:
        return self.scheduler.queue_depth

    def drain_rate_per_s(self, now_s: float | None = None) -> float:
        """Requests completed per second over the recent window (0 when unknown)."""
        return self._done.per_s(time.monotonic() if now_s is None else now_s)

    # ---- the step ---------------------------------------------------------------------------
    def step(self) -> list[CoreOutput]:
        """Plan, run one model step (decode of the live rows fused with the admission of
        new ones), rescore finished beams; the requests that ended, in no particular order.
        Never raises: a failed model step fails the requests in it (``_step``), and any other
        failure fails every request the core holds (the scheduler's state is then unknown)
        and leaves the core empty and serving."""
        try:
            self._plan_and_run()
        except Exception as e:
            log.exception("engine step failed")
            self.idle_wait_s = None
            return self.fail_all(ModelError(f"engine step failed: {type(e).__name__}"))
        out, self._out = self._out, []
        return out

    def _plan_and_run(self) -> None:
        plan = self.scheduler.plan(time.monotonic())
        self.stats.queue_depth = self.scheduler.queue_depth
        self._drop(plan.expired, lambda: DeadlineExceeded("deadline passed while queued"))
        self._drop(plan.cancelled, lambda: Cancelled("request cancelled"))
        self._release(plan.release)
        self.stats.running = self.scheduler.live_seqs
        self.idle_wait_s = None
        for rid, tier in plan.tiers.items():  # modes chosen at admission: they decide the rows
            w = self._work[rid]
            for s in w.specs:  # a bulk search stepped down: its first expansion goes
                self._seq_owner.pop(s.seq_id, None)
            self._assign(w, self._expand(w.req.request, tier), tier)
        if plan.has_work:
            self._step([self._work[i] for i in plan.prefill if i in self._work], plan.decode)
        elif not (plan.expired or plan.cancelled or plan.release):
            self.idle_wait_s = plan.idle_wait_s if plan.idle_wait_s is not None else math.inf

    def fail_all(self, error: ChunlianError) -> list[CoreOutput]:
        """End every request with ``error`` and free every row (shutdown, a failed client)."""
        work = list(self._work.values())
        self.scheduler.reset()
        try:
            for r in self.runners:
                r.release([s.seq_id for w in work for s in w.specs])
        except Exception:  # the futures complete even when the runner is broken
            log.exception("could not free the rows")
        for w in work:
            self._end(w, error=error)
        out, self._out = self._out, []
        return out

    def _step(self, admitted: list[_Work], decode: bool) -> None:
        t0 = time.perf_counter()
        tokens0 = self._tokens()
        batch = self.scheduler.live_seqs + self.scheduler.live_search_rows
        try:
            specs = [s for w in admitted for s in w.specs]
            finished = self._run(specs, decode)
            self.stats.prefill_total += len(admitted)
        except Exception as e:  # a failed step fails the requests in it, not the core
            log.exception("model step failed")
            reason = f"generation failed: {type(e).__name__}"
            self._release(list(self.scheduler.running), lambda: ModelError(reason))
            return
        tokens = self._tokens() - tokens0
        self.stats.steps_total += 1
        self.stats.tokens_total += tokens
        report = StepReport(batch, time.perf_counter() - t0, tokens)
        for fn in self._listeners:
            try:
                fn(report)
            except Exception:  # a metrics hook must never take the core down
                log.exception("step listener failed")
        self._collect(finished)
        self.stats.running = self.scheduler.live_seqs

    def _tokens(self) -> int:
        return sum(r.tokens_emitted for r in self.runners)

    def _run(self, specs: list[SeqSpec], decode: bool) -> list[SeqOutput]:
        """One step of each runner with live rows or new ones: searches on the search
        runner (when there is one), the rest on the main runner."""
        if self.search_runner is None:
            return self.runner.step(specs) if specs or decode else []
        searches = [s for s in specs if s.beam is not None and not s.composed_search]
        plain = [s for s in specs if s.beam is None or s.composed_search]
        out: list[SeqOutput] = []
        for runner, new in ((self.runner, plain), (self.search_runner, searches)):
            if new or runner.n_live:
                out += runner.step(new)
        return out

    def _collect(self, finished: list[SeqOutput]) -> None:
        done: list[_Work] = []
        now = time.monotonic()
        for out in finished:
            rid = self._seq_owner.pop(out.seq_id, None)
            w = self._work.get(rid) if rid is not None else None
            if w is None:
                continue
            w.outputs.append(out)
            rows = w.specs[0].rows if out.beams else 1
            if self.scheduler.on_seqs_finished(rid, rows, now):  # type: ignore[arg-type]
                done.append(w)
        beams = [w for w in done if w.beam is not None]
        ranked = self._rerank(beams) if beams else {}
        for w in done:
            self._finish(w, ranked.get(w.req.req_id))

    def _rerank(self, beams: list[_Work]) -> dict[int, list[BeamHyp]]:
        """The reranked lines of finished beams (one batched pass per rescoring model); each
        beam's ``outputs[0].upper`` is the searched (model) form of its 上联."""
        todo = [(w, w.beam) for w in beams if w.beam is not None and w.beam.reranked]
        if not todo or self.rescorer is None:
            return {}
        try:
            order = self.rescorer.rerank([BeamJob(w.outputs[0].upper, w.req.request.style, beam, w.outputs[0].beams)
                                          for w, beam in todo])
        except Exception as e:
            log.exception("rescoring failed")
            for w, _ in todo:
                self._end(w, error=ModelError(f"rescoring failed: {type(e).__name__}"))
            return {}
        return {w.req.req_id: hyps for (w, _), hyps in zip(todo, order, strict=True)}

    def _finish(self, w: _Work, ranked: list[BeamHyp] | None) -> None:
        """Build the request's result: a beam's best ``n`` lines in their ranked order."""
        if w.req.req_id not in self._work:  # ended already (its rescoring failed)
            return
        req = w.req.request
        outputs = w.outputs
        searched = w.beam is not None
        if searched:
            outputs = searched_lines(outputs[0], ranked, req.params.n)
        try:
            tag = self.search_tag if searched else self.model_tag
            result = replace(build_result(req, outputs, self.hengpi, tag, ranked=searched),
                             served=served_of(req, w.tier))
        except ChunlianError as e:
            self._end(w, error=e)
        except Exception as e:  # an error in one request ends only that request
            log.exception("post-processing failed")
            self._end(w, error=ModelError(f"post-processing failed: {type(e).__name__}"))
        else:
            self._done.add(time.monotonic())
            self._end(w, result=result, beams=w.outputs[0].beams if searched else ())

    def _drop(self, req_ids: list[int], error: Callable[[], ChunlianError]) -> None:
        """End queued requests that never ran."""
        for rid in req_ids:
            w = self._work.get(rid)
            if w is not None:
                self._end(w, error=error())

    def _release(self, req_ids: list[int], error: Callable[[], ChunlianError] | None = None) -> None:
        """Free the rows of running requests (aborted, past deadline, or failed)."""
        for rid in req_ids:
            self.scheduler.fail_running(rid)
            w = self._work.get(rid)
            if w is None:
                continue
            for r in self.runners:
                r.release([s.seq_id for s in w.specs])
            if error is not None:
                err = error()
            elif w.aborted:
                err = Cancelled("request cancelled")
            else:
                err = DeadlineExceeded("deadline passed while generating")
            self._end(w, error=err)

    def _end(self, w: _Work, result: CoupletResult | None = None, error: ChunlianError | None = None,
             beams: tuple[BeamHyp, ...] = ()) -> None:
        if self._work.pop(w.req.req_id, None) is None:
            return
        for s in w.specs:
            self._seq_owner.pop(s.seq_id, None)
        self.stats.count_end(error)
        self._out.append(CoreOutput(w.req.req_id, result, error, beams))

