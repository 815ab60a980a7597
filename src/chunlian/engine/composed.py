"""Composed couplets (藏头 names, keywords) in the quality modes: two requests to one core.

A composed couplet asked for in ``best`` or ``auto`` is written in two stages, each an
ordinary request of the core (``EngineCore``), so that scheduling, deadlines, the search
pool and rescoring work for it as for any 下联:

1. ``upper_search``: a constrained beam of ``UPPER_SEARCH.width`` rows over the *served*
   (forward) weights writes whole couplets under the heads or keyword
   (``SeqSpec.composed_search``; on the main rows, like greedy work), the name's second head
   scored where it opens the 下联. The 上联 of its best couplet is kept: the one that leads
   to the likeliest 下联 under the name, where greedy decoding commits to its first choice at
   every step and a search of the 上联 alone picks the surname's stock line for every name.
2. ``answer_request``: that 上联 is answered like any typed one, in the requested quality
   (the best mode's search of the reverse-trained weights and its rescoring, or what ``auto``
   gets at admission), with the name's second head forced at the start of the 下联
   (``CoupletRequest.heads`` beside ``upper``). Its ``served`` is the answer's.

``n`` > 1 asks stage 2 for ``n`` distinct reranked 下联 of the one 上联: distinct couplets,
best first. Both stages write simplified characters; a name or keyword typed in traditional
ones gets its couplet converted back at the end (``rerank.in_typed_script``). A ``fast``
request, a seed or ``regenerate`` is written as before: one sequence of the served weights,
上联 then 下联.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from chunlian.engine.request import model_request
from chunlian.engine.rerank import in_typed_script
from chunlian.errors import ChunlianError
from chunlian.types import BeamParams, CoupletRequest, CoupletResult, DecodeParams

# the 上联's search: 8 rows of the main pool for 6 or 4 steps (a quarter of a best
# answer's 32 search rows, for a line a third as long as the two it answers)
UPPER_SEARCH = BeamParams(width=8)


def wants_search(req: CoupletRequest) -> bool:
    """Whether ``req`` is a composed couplet that the quality modes write (two stages)."""
    p = req.params
    return req.upper is None and req.quality != "fast" and p.seed is None and p.beam is None


def search_width(max_rows: int) -> int:
    """The 上联 search's width on an engine of ``max_rows`` main rows (each replica's share:
    a request may hold no more): ``UPPER_SEARCH``'s, narrower on a smaller engine."""
    return max(1, min(UPPER_SEARCH.width, max_rows))


def upper_search(req: CoupletRequest, width: int = UPPER_SEARCH.width) -> CoupletRequest:
    """Stage 1: the beam search of ``req``'s 上联 (its best line is the result's ``upper``),
    in simplified characters (the model's)."""
    return replace(model_request(req), quality="fast", params=DecodeParams(n=1, beam=BeamParams(width)))


def answer_request(req: CoupletRequest, upper: str, timeout_s: float | None) -> CoupletRequest:
    """Stage 2: the 下联 request for the composed ``upper`` (simplified, as stage 1 writes
    it), in ``req``'s quality, with the name's heads (``heads[1]`` heads the 下联)."""
    heads = model_request(req).heads
    return CoupletRequest(style=req.style, upper=upper, heads=heads, params=DecodeParams(n=req.params.n),
                          priority=req.priority, timeout_s=timeout_s, quality=req.quality)


def left_s(req: CoupletRequest, started_s: float) -> float | None:
    """What is left of ``req``'s own timeout after stage 1 (None: it has none, the
    engine's default applies to each stage)."""
    if req.timeout_s is None:
        return None
    return max(0.001, req.timeout_s - (time.monotonic() - started_s))


async def generate_composed(
    generate: Callable[[CoupletRequest], Awaitable[CoupletResult]], req: CoupletRequest,
    width: int = UPPER_SEARCH.width,
) -> CoupletResult:
    """``req`` (``wants_search``) through ``generate`` (an ``EngineClient``'s), in two stages;
    ``width``: the 上联 search's (``search_width``)."""
    started_s = time.monotonic()
    first = await generate(upper_search(req, width))
    return in_typed_script(req, await generate(answer_request(req, first.best.upper, left_s(req, started_s))))


Answers = list[CoupletResult | ChunlianError]


def staged_answers(generate: Callable[[list[CoupletRequest]], Answers], requests: Sequence[CoupletRequest],
                   width: int = UPPER_SEARCH.width) -> Answers:
    """Batch form of ``generate_composed`` (``offline.OfflineGenerator``): the answers of
    ``requests`` in order, those that ``wants_search`` in two stages. ``generate`` answers a
    batch in order (an error object for a request that fails); it is called twice: the
    other requests run beside the 上联 searches."""
    staged = [k for k, r in enumerate(requests) if wants_search(r)]
    rest = [k for k, r in enumerate(requests) if not wants_search(r)]
    first = generate([upper_search(requests[k], width) for k in staged] + [requests[k] for k in rest])
    answers: dict[int, CoupletResult | ChunlianError] = dict(zip(staged + rest, first, strict=True))
    seconds = [(k, answer_request(requests[k], a.best.upper, None))
               for k in staged if isinstance(a := answers[k], CoupletResult)]
    if seconds:
        for k, a in zip([k for k, _ in seconds], generate([r for _, r in seconds]), strict=True):
            answers[k] = in_typed_script(requests[k], a) if isinstance(a, CoupletResult) else a
    return [answers[k] for k in range(len(requests))]
