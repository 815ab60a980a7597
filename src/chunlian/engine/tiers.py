"""The modes that can answer a request, and how ``auto`` picks one (plain data, no torch).

A request asks for a ``Quality``: ``best``, ``fast`` or ``auto``. It is answered by a
``Served`` mode:

* ``best``: the quality preset. The reverse-trained weights' constrained beam of 32, its
  best 16 lines reranked by their channel score (weight 0.75) and by the served weights'
  forward score (weight 0.5): ``docs/performance.md`` ("Quality mode: search width and rescoring")
  has the table it was chosen from.
* ``good``: the same search at width 8, for a quarter of the rows.
* ``fast``: greedy decoding (or sampling, when the request has a seed) of the served weights.

A bulk ``best`` search that does not fit the bulk share beside interactive work runs as
``good`` (``Scheduler._bulk_search``).

``auto`` is decided by the scheduler when the request is admitted (``choose``), from the
queue wait it measures against the request's deadline: the best mode while requests are
admitted promptly, a narrower search as the wait grows, greedy decoding beyond. So at light
load everyone gets the best couplet, and under a peak the service steps down instead of
refusing: a search's rows cost the same step time as greedy ones, and a best answer holds
32 of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chunlian.errors import InvalidInput
from chunlian.types import BEST_SEARCH_ROWS, BeamParams, CoupletRequest, Quality, Served

# the search is width 32 (narrower searches lose more than BLEU shows when read blind); only
# its best 16 lines are reranked, half the rescoring for 93-100% of the BLEU gain
# (docs/performance.md, "Quality mode: search width and rescoring")
BEST = BeamParams(width=BEST_SEARCH_ROWS, channel_weight=0.75, rescore_weight=0.5, rescore_top=16)
GOOD = BeamParams(width=8, channel_weight=0.75, rescore_weight=0.5)
# the searching modes, best first; anything else is ``fast``
SEARCHES: tuple[tuple[Served, BeamParams], ...] = (("best", BEST), ("good", GOOD))
SEARCH_OF: dict[str, BeamParams] = dict(SEARCHES)


def fixed_tier(req: CoupletRequest, searching: bool) -> Served | None:
    """The mode that answers ``req`` whatever the load, or None when the scheduler chooses
    (``auto``). ``searching``: whether the engine has the weights to search with. A request
    a search cannot answer (a seed; a composed couplet, whose 上联 the service searches
    first: ``engine.composed``) is ``fast``."""
    if not req.searchable or not searching or req.quality == "fast":
        return "fast"
    if req.quality == "best":
        return "best"
    return None


def core_tier(req: CoupletRequest, pooled: bool) -> Served | None:
    """The mode that answers ``req`` in an engine core whatever the load (None: the scheduler
    chooses); ``pooled``: the core has a search pool. A request with a search of its own
    (CLI, offline quality mode, Celery jobs, sweeps) runs it as it is and its answer names the
    preset it ran (``served_of``); with a search pool, only the presets' searches are served,
    from that pool (raises ``InvalidInput`` for another)."""
    if req.params.beam is None:
        return fixed_tier(req, pooled)
    tier = served_of(req, None)
    # the search of a composed 上联 (``engine.composed``) runs on the main rows, as do all
    # searches of an engine without a search pool: their own rows (``params.rows``)
    if req.upper is None:
        return "fast"
    if not pooled:
        return tier
    if tier == "fast":
        raise InvalidInput("this engine searches only with its quality presets; use quality", "beam")
    return tier


def served_of(req: CoupletRequest, tier: Served | None) -> Served:
    """What a finished request says served it: its tier, else (a request with a search
    of its own: CLI, sweeps) the mode whose search it ran, else ``fast``."""
    if tier is not None:
        return tier
    for name, params in SEARCHES:
        if req.params.beam == params:
            return name
    return "fast"


@dataclass(frozen=True)
class StepDown:
    """When ``auto`` steps down. Measured: ``wait_s``, how long recent requests waited for
    admission (and the oldest waiting one has so far); ``service_s``, how long each mode
    recently took once admitted; ``backlog``, whether more rows are asked for than the main
    pool has free (a saturated engine: every search row taken then is a greedy answer less).
    A search is chosen only without a backlog, when the wait is at most its share of the
    request's whole timeout (``wait_share`` for the best mode, twice that for ``good``), its
    rows are free, and its recent service time fits in what is left of the deadline.

    ``busy_share``: the main pool counts as a backlog once this share of its rows is live. A
    closed-loop peak admits every request at once, so it never waits, yet its greedy rows
    keep the cores busy: a search's rows then cost greedy answers as they do in a backlog."""

    wait_share: float = 0.02
    busy_share: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 <= self.wait_share <= 1.0:
            raise ValueError(f"wait_share must be between 0 and 1, got {self.wait_share}")
        if not 0.0 < self.busy_share <= 1.0:
            raise ValueError(f"busy_share must be above 0 and at most 1, got {self.busy_share}")

    def busy(self, live_rows: int, max_rows: int) -> bool:
        """Whether the main pool is busy enough to count as a backlog."""
        return live_rows >= self.busy_share * max_rows

    def choose(self, *, wait_s: float, timeout_s: float, left_s: float, free_rows: int,
               service_s: dict[str, float], backlog: bool = False) -> Served:
        """The mode for an ``auto`` request admitted now."""
        if backlog:
            return "fast"
        if not math.isfinite(timeout_s):
            timeout_s = left_s if math.isfinite(left_s) else math.inf
        for k, (name, params) in enumerate(SEARCHES):
            limit_s = self.wait_share * (k + 1) * timeout_s
            if params.width <= free_rows and wait_s <= limit_s and service_s.get(name, 0.0) < left_s:
                return name
        return "fast"


def rows_of(tier: Served, req: CoupletRequest) -> int:
    """KV-cache rows ``req`` holds when ``tier`` answers it."""
    params = SEARCH_OF.get(tier)
    return params.width if params is not None else req.params.rows


def quality_or_error(value: str) -> Quality:
    """``value`` as a ``Quality`` (raises ``ValueError`` naming the choices)."""
    for q in ("auto", "best", "fast"):
        if value == q:
            return q
    raise ValueError(f"quality must be one of auto, best, fast; got {value!r}")
