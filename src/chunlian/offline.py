"""Synchronous batch generation without the async engine: CLI, evaluation, benchmarks.

Requests are expanded into sequences and run through one ``ModelRunner`` with iteration-
level admission (``run_all``); results come back in input order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chunlian.data.blocklist import Blocklist
from chunlian.engine.request import SeqOutput, expand, model_request
from chunlian.engine.rerank import build_result
from chunlian.engine.runner import ModelRunner
from chunlian.errors import ChunlianError, InvalidInput
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.model.styles import STYLES
from chunlian.text import validate_upper
from chunlian.types import CoupletRequest, CoupletResult, DecodeParams
from chunlian.validation import validate_heads, validate_keyword

if TYPE_CHECKING:
    from chunlian.model.beam import BeamSearcher

MAX_N = 8
MAX_BEAM = 32
MAX_CHANNEL_WEIGHT = 4.0


@dataclass(frozen=True)
class QualityPreset:
    """The offline quality mode (``--quality``): slower, closer to real couplets. Chosen on
    one half of the validation split (``benchmarks/channel_sweep.py --half a``)."""

    beam_width: int = 32
    channel_weight: float = 0.75
    # the shipped (forward-only) weights' log p(lower | upper) added to each candidate's score
    rescore_weight: float = 0.5


QUALITY = QualityPreset()


def check_style(style: str) -> str:
    if style not in STYLES:
        raise InvalidInput(f"unknown style {style!r}; expected one of {', '.join(STYLES)}", "style")
    return style


def check_n(n: int) -> int:
    if not 1 <= n <= MAX_N:
        raise InvalidInput(f"n must be between 1 and {MAX_N}, got {n}", "n")
    return n


def couplet_request(
    upper: str, style: str = "traditional", n: int = 1, seed: int | None = None, **kw: object
) -> CoupletRequest:
    """A validated request for a 下联 (raises ``InvalidInput`` naming the field)."""
    return CoupletRequest(
        style=check_style(style), upper=validate_upper(upper),
        params=DecodeParams(n=check_n(n), seed=seed), **kw,  # type: ignore[arg-type]
    )


def check_beam(width: int) -> int:
    if not 1 <= width <= MAX_BEAM:
        raise InvalidInput(f"beam width must be between 1 and {MAX_BEAM}, got {width}", "beam")
    return width


def check_channel(weight: float, beam_width: int) -> float:
    """A channel-rerank weight (``model.channel``): 0 (off) or positive with a beam."""
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
    """The model, a runner and the 横批 selector, for batch work in one process."""

    loaded: LoadedModel
    runner: ModelRunner
    hengpi: object | None
    beam_width: int = 1  # > 1: greedy 下联 requests use constrained beam search
    # > 0 (with beam_width > 1): the beam's candidates are reranked by
    # log p(lower | upper) + channel_weight * log p(upper | lower) (model.channel)
    channel_weight: float = 0.0
    # > 0 (with a beam): rescore_weight * log p(lower | upper) of these other weights joins
    # each candidate's score (a second opinion on the beam's candidates; model.channel)
    rescorers: tuple[LoadedModel, ...] = ()
    rescore_weight: float = 0.0
    # built at the first beam request and kept: its KV caches (~40 MB at 64 rows) are
    # allocated once, not zeroed again for every request
    _searcher: BeamSearcher | None = field(default=None, init=False, repr=False)

    @classmethod
    def load(
        cls, model_path: Path | None = None, device: str = "cpu", capacity: int = 64, beam_width: int = 1,
        blocklist: Blocklist | None = None, channel_weight: float = 0.0,
        rescore: tuple[Path, ...] = (), rescore_weight: float = 0.0,
    ) -> OfflineGenerator:
        """``blocklist``: the bans on generated text (default: ``Settings.generation_blocklist``
        of the environment's settings, as the service applies them); ``device``: cpu, cuda
        or auto (``model.device``)."""
        from chunlian.config import load_settings
        from chunlian.model.device import resolve_device
        from chunlian.model.hengpi import HengpiSelector

        device = resolve_device(device)

        check_beam(beam_width)
        check_channel(channel_weight, beam_width)
        check_rescore(rescore_weight, beam_width, len(rescore))
        loaded = load_weights(model_path, device)
        bans = load_settings().generation_blocklist() if blocklist is None else blocklist
        runner = ModelRunner(loaded, capacity, device, blocklist=bans)
        rescorers = tuple(load_weights(p, device) for p in rescore) if rescore_weight > 0 else ()
        return cls(loaded, runner, HengpiSelector.from_loaded(loaded), beam_width, channel_weight,
                   rescorers, rescore_weight)

    @classmethod
    def load_quality(cls, device: str = "cpu", capacity: int = 64, blocklist: Blocklist | None = None,
                     model_path: Path | None = None) -> OfflineGenerator:
        """The offline quality mode (``QUALITY``): the reverse-trained weights' beam (the
        shipped ones unless ``model_path``), reranked by their channel score and by the shipped
        weights (the CLI's ``--quality`` builds the same from its flags, which may override each
        part; bulk jobs: ``jobs.quality``)."""
        from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS

        return cls.load(model_path or QUALITY_WEIGHTS, device, capacity=capacity, beam_width=QUALITY.beam_width,
                        blocklist=blocklist, channel_weight=QUALITY.channel_weight,
                        rescore=(DEFAULT_WEIGHTS,), rescore_weight=QUALITY.rescore_weight)

    def generate(self, requests: list[CoupletRequest]) -> list[CoupletResult | ChunlianError]:
        """Results in input order; a request that fails yields its error, not an abort.

        With ``beam_width > 1``, greedy requests for a 下联 (no seed, ``n == 1``) are
        answered by beam search; composed and sampled ones run through the runner as usual.
        """
        specs = []
        owners: list[list[int]] = []
        next_id = 1
        beamed = self._beam(requests)
        for req in requests:
            if id(req) in beamed:
                owners.append([beamed[id(req)].seq_id])
                continue
            s = expand(req, next_id)
            next_id += len(s)
            specs.extend(s)
            owners.append([x.seq_id for x in s])
        outs = self.runner.run_all(specs)
        outs.update({o.seq_id: o for o in beamed.values()})
        results: list[CoupletResult | ChunlianError] = []
        for req, ids in zip(requests, owners, strict=True):
            try:
                results.append(build_result(req, [outs[i] for i in ids], self.hengpi, self.loaded.tag))  # type: ignore[arg-type]
            except ChunlianError as e:
                results.append(e)
        return results

    def _beam(self, requests: list[CoupletRequest]) -> dict[int, SeqOutput]:
        """Beam-searched outputs of the eligible requests, keyed by ``id(request)``; their
        sequence ids are negative so they never meet the runner's (1, 2, ...)."""
        if self.beam_width <= 1:
            return {}
        todo = [r for r in requests if r.upper is not None and r.params.greedy]
        if not todo:
            return {}
        searcher = self._searcher
        if searcher is None:
            from chunlian.model.beam import BeamSearcher

            searcher = self._searcher = BeamSearcher(
                self.loaded, self.runner.constrainer, self.runner.tone_bias,
                max_rows=max(self.runner.capacity, self.beam_width),
            )
        items = [(model_request(r).upper or "", r.style) for r in todo]
        if self.channel_weight > 0 or self.rescore_weight > 0:
            from chunlian.model.channel import Scores, candidate_scores, rerank

            nbest = searcher.search_nbest(items, self.beam_width)
            terms: list[tuple[float, Scores]] = []
            if self.channel_weight > 0:
                terms.append((self.channel_weight, candidate_scores((self.loaded,), items, nbest)))
            if self.rescore_weight > 0:
                terms.append((self.rescore_weight, candidate_scores(self.rescorers, items, nbest, forward=True)))
            found = rerank(nbest, *terms)
        else:
            found = searcher.search(items, self.beam_width)
        return {  # the searched 上联 (model form): build_result converts back to what was typed
            id(r): SeqOutput(-1 - i, model_request(r).upper or "", b.lower, b.mean_logprob)
            for i, (r, b) in enumerate(zip(todo, found, strict=True))
        }
