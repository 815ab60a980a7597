"""Synchronous batch generation in one process: CLI, evaluation, bulk jobs, benchmarks.

``OfflineGenerator`` is the in-process client of the engine core (``engine.core``): the
requests of a batch go through the same continuous batch, request kinds and rules as the
service's; results come back in input order. The request builders here validate what a
command line or a job item gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from chunlian.data.blocklist import Blocklist
from chunlian.engine.batch import run_batch
from chunlian.engine.composed import search_width, staged_answers, wants_search
from chunlian.engine.config import EngineConfig
from chunlian.engine.core import CoreOutput, EngineCore
from chunlian.engine.request import BeamHyp
from chunlian.engine.rescore import Rescorer
from chunlian.engine.runner import ModelRunner
from chunlian.engine.tiers import BEST
from chunlian.errors import ChunlianError, InvalidInput, ModelError
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.model.styles import STYLES
from chunlian.types import BeamParams, CoupletRequest, CoupletResult, DecodeParams
from chunlian.validation import (
    MAX_CANDIDATES,
    validate_heads,
    validate_keyword,
    validate_user_upper,
)

# requests the in-process client keeps queued in the core, per row of capacity: enough for
# every free row to be filled at each step, few enough that the scheduler's scans stay short
_WINDOW_FACTOR = 2

MAX_BEAM = 32
MAX_CHANNEL_WEIGHT = 4.0


# the quality mode (``--quality``; the service's best mode): slower, closer to real couplets
QUALITY = BEST


def check_style(style: str) -> str:
    if style not in STYLES:
        raise InvalidInput(f"unknown style {style!r}; expected one of {', '.join(STYLES)}", "style")
    return style


def check_n(n: int) -> int:
    if not 1 <= n <= MAX_CANDIDATES:
        raise InvalidInput(f"n must be between 1 and {MAX_CANDIDATES}, got {n}", "n")
    return n


def couplet_request(
    upper: str, style: str = "traditional", n: int = 1, seed: int | None = None, **kw: object
) -> CoupletRequest:
    """A validated request for a 下联 (raises ``InvalidInput`` naming the field)."""
    return CoupletRequest(
        style=check_style(style), upper=validate_user_upper(upper),
        params=DecodeParams(n=check_n(n), seed=seed), **kw,  # type: ignore[arg-type]
    )


def check_beam(width: int) -> int:
    if not 1 <= width <= MAX_BEAM:
        raise InvalidInput(f"beam width must be between 1 and {MAX_BEAM}, got {width}", "beam")
    return width


def check_channel(weight: float, beam_width: int) -> float:
    """A channel-rerank weight (``engine.channel``): 0 (off) or positive with a beam."""
    if not 0.0 <= weight <= MAX_CHANNEL_WEIGHT:
        raise InvalidInput(f"channel weight must be between 0 and {MAX_CHANNEL_WEIGHT}, got {weight}", "channel")
    if weight > 0 and beam_width < 2:
        raise InvalidInput("channel reranking ranks beam candidates: it needs a beam width of 2 or more", "channel")
    return weight


def check_rescore(weight: float, beam_width: int, models: int) -> float:
    """A rescoring weight: 0 (off) or positive with a beam and at least one rescoring model."""
    if not 0.0 <= weight <= MAX_CHANNEL_WEIGHT:
        raise InvalidInput(f"rescore weight must be between 0 and {MAX_CHANNEL_WEIGHT}, got {weight}", "rescore")
    if weight > 0 and beam_width < 2:
        raise InvalidInput("rescoring ranks beam candidates: it needs a beam width of 2 or more", "rescore")
    if weight > 0 and not models:
        raise InvalidInput("a rescore weight needs weights to rescore with", "rescore")
    return weight


def compose_request(
    heads: str | None = None, keyword: str | None = None, length: int = 7,
    style: str = "traditional", n: int = 1, seed: int | None = None, **kw: object,
) -> CoupletRequest:
    """A validated request for a whole couplet opened by ``heads`` or ``keyword``."""
    if (heads is None) == (keyword is None):
        raise InvalidInput("give exactly one of heads or keyword", "heads")
    if length not in (5, 7):
        raise InvalidInput(f"length must be 5 or 7, got {length}", "length")
    text = validate_heads(heads) if heads is not None else validate_keyword(keyword, length)
    return CoupletRequest(
        style=check_style(style),
        heads=text if heads is not None else None,
        keyword=text if keyword is not None else None,
        length=length,
        params=DecodeParams(n=check_n(n), seed=seed),
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class OfflineGenerator:
    """The in-process client of an ``EngineCore`` for batch work in one process (CLI,
    evaluation, Celery workers, bulk jobs): ``generate`` adds a batch of requests to the core
    and steps it until every one has ended. The core is the same one the service runs, so
    every request kind behaves here as it does there."""

    loaded: LoadedModel
    runner: ModelRunner
    hengpi: object | None
    beam_width: int = 1  # > 1: greedy 下联 requests are answered by a constrained beam search
    # > 0 (with beam_width > 1): the beam's candidates are reranked by
    # log p(lower | upper) + channel_weight * log p(upper | lower) (engine.channel)
    channel_weight: float = 0.0
    # > 0 (with a beam): rescore_weight * log p(lower | upper) of these other weights joins
    # each candidate's score (a second opinion on the beam's candidates; engine.channel)
    rescorers: tuple[LoadedModel, ...] = ()
    rescore_weight: float = 0.0
    rescore_top: int = 0  # rerank only the beam's best lines (0: every one; ``BeamParams``)
    core: EngineCore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        config = EngineConfig(max_batch_size=self.runner.capacity, max_queue_size=_WINDOW_FACTOR * self.runner.capacity,
                              max_wait_ms=0.0, min_prefill_seqs=1, coalesce=False, engine_nice=0)
        rescorer = Rescorer(self.loaded, self.rescorers) if self.channel_weight > 0 or self.rescore_weight > 0 else None
        self.core = EngineCore(config, self.runner, self.hengpi, self.loaded.tag, rescorer)  # type: ignore[arg-type]

    @classmethod
    def load(
        cls, model_path: Path | None = None, device: str = "cpu", capacity: int = 64, beam_width: int = 1,
        blocklist: Blocklist | None = None, channel_weight: float = 0.0,
        rescore: tuple[Path, ...] = (), rescore_weight: float = 0.0, rescore_top: int = 0,
    ) -> OfflineGenerator:
        """``blocklist``: the bans on generated text (default: the safety blocklist alone;
        the service's are ``Settings.generation_blocklist()``); ``device``: cpu, cuda or auto
        (``model.device``)."""
        from chunlian.model.device import resolve_device
        from chunlian.model.hengpi import HengpiSelector

        device = resolve_device(device)

        check_beam(beam_width)
        check_channel(channel_weight, beam_width)
        check_rescore(rescore_weight, beam_width, len(rescore))
        loaded = load_weights(model_path, device)
        runner = ModelRunner(loaded, max(capacity, beam_width), device, blocklist=blocklist)
        rescorers = tuple(load_weights(p, device) for p in rescore) if rescore_weight > 0 else ()
        # the 横批 is chosen with the rescoring weights' embeddings where there are some (the
        # quality mode's forward weights), as the engine's best mode chooses it
        hengpi = HengpiSelector.from_loaded(rescorers[0] if rescorers else loaded)
        return cls(loaded, runner, hengpi, beam_width, channel_weight,
                   rescorers, rescore_weight, min(rescore_top, beam_width))

    @classmethod
    def load_quality(cls, device: str = "cpu", capacity: int = 64, blocklist: Blocklist | None = None,
                     model_path: Path | None = None) -> OfflineGenerator:
        """The offline quality mode (``QUALITY``): the reverse-trained weights' beam (the
        shipped ones unless ``model_path``), reranked by their channel score and by the shipped
        weights (the CLI's ``--quality`` builds the same from its flags, which may override each
        part; bulk jobs: ``jobs.quality``)."""
        from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS

        return cls.load(model_path or QUALITY_WEIGHTS, device, capacity=capacity, beam_width=QUALITY.width,
                        blocklist=blocklist, channel_weight=QUALITY.channel_weight,
                        rescore=(DEFAULT_WEIGHTS,), rescore_weight=QUALITY.rescore_weight,
                        rescore_top=QUALITY.rescore_top)

    def beam_params(self) -> BeamParams | None:
        """The search this generator gives greedy 下联 requests (None: greedy decoding)."""
        if self.beam_width <= 1:
            return None
        reranked = self.channel_weight > 0 or self.rescore_weight > 0
        return BeamParams(self.beam_width, self.channel_weight, self.rescore_weight,
                          self.rescore_top if reranked else 0)

    def generate(self, requests: list[CoupletRequest]) -> list[CoupletResult | ChunlianError]:
        """Results in input order; a request that fails yields its error, not an abort.

        With ``beam_width > 1``, greedy requests for a 下联 (no seed, ``n == 1``) are
        answered by beam search, and composed ones in ``best`` or ``auto`` in two stages
        (``engine.composed``: the 上联 searched with this generator's weights); sampled ones
        are decoded as usual.
        """
        beam = self.beam_params()
        if beam is not None and any(wants_search(r) for r in requests):  # composed, in the quality mode
            return staged_answers(self.generate, requests, search_width(self.runner.capacity))
        todo = [replace(r, params=replace(r.params, beam=beam))
                if beam is not None and r.upper is not None and r.params.greedy else r for r in requests]
        return [o.result if o.result is not None else o.error or ModelError("no answer") for o in self.run(todo)]

    def beam_nbest(self, items: list[tuple[str, str]], width: int) -> list[tuple[BeamHyp, ...]]:
        """The final lines of a beam of ``width`` for each ``(upper, style)``, best first by
        the beam's own score, before any reranking (sweeps of the rerank weights)."""
        reqs = [CoupletRequest(style=style, upper=upper, params=DecodeParams(beam=BeamParams(width)))
                for upper, style in items]
        return [o.beams for o in self.run(reqs)]

    def run(self, requests: list[CoupletRequest]) -> list[CoreOutput]:
        """Each request's output from the core, in input order (``engine.batch.run_batch``)."""
        return run_batch(self.core, requests, _WINDOW_FACTOR * self.runner.capacity)
