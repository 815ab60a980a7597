"""Rescoring a finished beam's lines: the batched forward work the engine core runs after
a step in which beam searches finished (``EngineCore``).

A beam ranks its lines by ``log p(lower | upper)`` under the searching weights. With
``BeamParams.channel_weight`` the searching weights' channel score ``log p(upper | lower)``
joins (``engine.channel``: it rewards lines that answer this very 上联), and with
``rescore_weight`` the forward score of other weights (in the quality preset: the shipped
ones voting on the reverse-trained weights' candidates). All lines of every request that
finished in one step are scored in one batched pass per model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from chunlian.engine.channel import ChannelScorer
from chunlian.engine.request import BeamHyp
from chunlian.model.checkpoint import LoadedModel
from chunlian.types import BeamParams


@dataclass(frozen=True)
class BeamJob:
    """One finished beam to rerank: the searched 上联 (model form), style and lines."""

    upper: str
    style: str
    params: BeamParams
    hyps: tuple[BeamHyp, ...]


@dataclass
class Rescorer:
    """The models a core reranks beams with: ``searching`` (the runner's weights, for the
    channel term) and ``forward`` (other weights, averaged, for the rescoring term)."""

    searching: LoadedModel
    forward: tuple[LoadedModel, ...] = ()
    _channel: ChannelScorer = field(init=False, repr=False)
    _forward: tuple[ChannelScorer, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self._channel = ChannelScorer(self.searching)
        self._forward = tuple(ChannelScorer(m, forward=True) for m in self.forward)

    def rerank(self, jobs: Sequence[BeamJob]) -> list[list[BeamHyp]]:
        """Each job's lines, best first by ``logprob + channel_weight * channel +
        rescore_weight * forward`` (ties keep the beam's order); with ``rescore_top``, only
        the beam's best lines are rescored and the others follow them as the beam left them."""
        tops = [j.hyps[: j.params.rescore_top or len(j.hyps)] for j in jobs]
        triples = [(j.upper, h.lower, j.style) for j, top in zip(jobs, tops, strict=True) for h in top]
        channel = self._scores([self._channel], triples,
                               any(j.params.channel_weight > 0 for j in jobs))
        forward = self._scores(list(self._forward), triples, any(j.params.rescore_weight > 0 for j in jobs))
        out: list[list[BeamHyp]] = []
        at = 0
        for j, top in zip(jobs, tops, strict=True):
            cw, rw = j.params.channel_weight, j.params.rescore_weight
            totals = [h.logprob + cw * channel[at + k] + rw * forward[at + k] for k, h in enumerate(top)]
            # a stable sort, reverse included: ties keep the beam's order
            ranked = [top[k] for k in sorted(range(len(totals)), key=totals.__getitem__, reverse=True)]
            out.append(ranked + list(j.hyps[len(top):]))
            at += len(top)
        return out

    @staticmethod
    def _scores(scorers: list[ChannelScorer], triples: list[tuple[str, str, str]], wanted: bool) -> list[float]:
        """The scorers' mean score of each triple (zeros when no job asks for the term)."""
        if not wanted or not triples:
            return [0.0] * len(triples)
        if not scorers:
            raise ValueError("a rescore weight needs weights to rescore with")
        per = [s.score(triples) for s in scorers]
        return [sum(col) / len(col) for col in zip(*per, strict=True)]
