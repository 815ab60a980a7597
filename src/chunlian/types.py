"""Type aliases and plain value objects shared across the package (no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Style = Literal["traditional", "business", "family", "literary"]
Priority = Literal["interactive", "bulk"]
BatchingMode = Literal["continuous", "static"]
# what a request asks for: the best couplet the load allows (auto), the quality mode's
# search (best) or the greedy answer (fast)
Quality = Literal["auto", "best", "fast"]
# what answered it: the quality mode's search (best), a narrower search (good) or greedy
# decoding / sampling (fast)
Served = Literal["best", "good", "fast"]
QUALITIES: tuple[Quality, ...] = ("auto", "best", "fast")

DEFAULT_SAMPLING_TEMPERATURE = 0.8
# rows of the best mode's search (``engine.tiers.BEST``): the narrowest search pool that can
# run it, so a narrower one is refused where the configuration is made
BEST_SEARCH_ROWS = 32


@dataclass(frozen=True)
class BeamParams:
    """A constrained beam search of ``width`` rows, its final candidates reranked by
    ``log p(lower | upper)`` + ``channel_weight`` x the searching weights' channel score
    ``log p(upper | lower)`` + ``rescore_weight`` x the forward score of the engine's
    rescoring weights (``engine.channel``). Deterministic, like a greedy answer."""

    width: int
    channel_weight: float = 0.0
    rescore_weight: float = 0.0
    # rerank only the search's best ``rescore_top`` lines (0: all ``width``); the rest follow
    # them in the search's order
    rescore_top: int = 0

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"beam width must be >= 1, got {self.width}")
        if not 0 <= self.rescore_top <= self.width:
            raise ValueError(f"rescore_top must be between 0 and the width, got {self.rescore_top}")
        if self.channel_weight < 0 or self.rescore_weight < 0:
            raise ValueError("rescoring weights must be >= 0")

    @property
    def reranked(self) -> bool:
        return self.channel_weight > 0 or self.rescore_weight > 0

    def as_dict(self) -> dict[str, object]:
        return {"width": self.width, "channel_weight": self.channel_weight, "rescore_weight": self.rescore_weight,
                "rescore_top": self.rescore_top}


@dataclass(frozen=True)
class DecodeParams:
    """How to decode. ``seed is None and n == 1`` (no beam) means greedy (deterministic,
    cacheable); a seed or ``n > 1`` means sampling with ``temperature``/``top_k``/``top_p``
    and reranking; ``beam`` means a beam search whose best ``n`` distinct lines are the
    candidates (deterministic; seed and sampling parameters do not apply)."""

    n: int = 1
    seed: int | None = None
    temperature: float = DEFAULT_SAMPLING_TEMPERATURE
    top_k: int = 50
    top_p: float = 0.95
    beam: BeamParams | None = None

    @property
    def greedy(self) -> bool:
        return self.seed is None and self.n == 1 and self.beam is None

    @property
    def rows(self) -> int:
        """KV-cache rows the request holds while it runs: its beam, or one per candidate."""
        return self.beam.width if self.beam is not None else self.n

    def as_dict(self) -> dict[str, object]:
        """The fields as a plain dict (``dataclasses.asdict`` copies recursively: it cost
        the event loop a measurable share of each request)."""
        return {"n": self.n, "seed": self.seed, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "beam": None if self.beam is None else self.beam.as_dict()}


# CoupletRequest.identity(): upper, heads, keyword, length, style, decoding parameters, quality
RequestIdentity = tuple[str | None, str | None, str | None, int | None, str, DecodeParams, Quality]


@dataclass(frozen=True)
class CoupletRequest:
    """One generation request: a 下联 for ``upper``, or (compose) a whole couplet.

    Compose: ``heads`` (one or two characters opening the two lines: a name's, by
    ``names.line_heads``) or ``keyword`` (the 上联 begins with it), with ``length`` 5 or 7.
    Exactly one of upper/heads/keyword, except in the second stage of a composed couplet in
    the quality modes (``engine.composed``): ``upper`` with the name's ``heads``, the second
    of which heads the 下联. Text fields are already validated and normalised (``chunlian.text``).
    """

    style: str = "traditional"
    upper: str | None = None
    heads: str | None = None
    keyword: str | None = None
    length: int | None = None
    params: DecodeParams = field(default_factory=DecodeParams)
    priority: Priority = "interactive"
    timeout_s: float | None = None  # None: the engine's default
    # "fast" unless asked: library callers (CLI, eval) decode as they say; the HTTP API's
    # default is "auto"
    quality: Quality = "fast"

    @property
    def kind(self) -> str:
        return "couplet" if self.upper is not None else "compose"

    def identity(self) -> RequestIdentity:
        """Everything that determines the output, as a hashable value (coalescing of
        identical requests in flight, the cache key's material); not priority or timeout.
        A tuple, not a digest: it is built for every request on the event loop."""
        return (self.upper, self.heads, self.keyword, self.length, self.style, self.params, self.quality)

    @property
    def searchable(self) -> bool:
        """Whether a beam search (best, good) can answer it: a 下联 for a 上联, unseeded
        (a seed asks for samples), with no search of its own already."""
        return self.upper is not None and self.params.seed is None and self.params.beam is None


@dataclass(frozen=True)
class Couplet:
    upper: str
    lower: str
    hengpi: str
    style: str
    # ranks candidates: mean log-likelihood (scored only when n > 1) plus rule score; higher is better
    score: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"upper": self.upper, "lower": self.lower, "hengpi": self.hengpi, "style": self.style}


@dataclass(frozen=True)
class CoupletResult:
    """The engine's answer: the best couplet and, when n > 1, all candidates best first."""

    best: Couplet
    candidates: tuple[Couplet, ...] = ()
    model: str = ""
    served: Served = "fast"  # the mode that wrote it
