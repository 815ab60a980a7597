"""The quality modes in the engine core with the shipped weights: best is the offline
quality mode's search, n > 1 gives distinct reranked lines, auto is best at idle."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from chunlian.engine.config import EngineConfig
from chunlian.engine.core import CoreOutput, CoreRequest, EngineCore
from chunlian.offline import OfflineGenerator, compose_request, couplet_request
from chunlian.types import CoupletRequest, Quality

UPPERS = ["春回大地千山秀", "荷香难解莲心苦", "金鸡报晓，改革似春风化雨"]


@pytest.fixture(scope="module")
def core() -> EngineCore:
    return EngineCore.from_config(EngineConfig(max_batch_size=16, beam_rows=64, torch_threads=1))


def run(core: EngineCore, reqs: list[CoupletRequest]) -> list[CoreOutput]:
    for i, r in enumerate(reqs):
        core.add_request(CoreRequest(i, r, time.monotonic() + 60))
    out: dict[int, CoreOutput] = {}
    while core.has_unfinished:
        out.update((o.req_id, o) for o in core.step())
    return [out[i] for i in range(len(reqs))]


def asked(upper: str, quality: Quality, **kw: object) -> CoupletRequest:
    return replace(couplet_request(upper, **kw), quality=quality)  # type: ignore[arg-type]


def test_best_is_the_offline_quality_mode_and_fast_is_greedy(core: EngineCore) -> None:
    best = run(core, [asked(u, "best") for u in UPPERS])
    fast = run(core, [asked(u, "fast") for u in UPPERS])
    quality = OfflineGenerator.load_quality(capacity=64).generate([couplet_request(u) for u in UPPERS])
    greedy = OfflineGenerator.load(capacity=16).generate([couplet_request(u) for u in UPPERS])
    for b, f, q, g in zip(best, fast, quality, greedy, strict=True):
        assert b.result is not None and f.result is not None
        assert b.result.served == "best" and f.result.served == "fast"
        assert b.result.best.lower == q.best.lower  # type: ignore[union-attr]
        # the same 横批 and the same weights named: the search's (reverse-trained) ones
        assert (b.result.best.hengpi, b.result.model) == (q.best.hengpi, q.model)  # type: ignore[union-attr]
        assert "@rev-" in b.result.model and "@rev-" not in f.result.model
        assert f.result.best.lower == g.best.lower  # type: ignore[union-attr]
    assert core.runner.n_live == 0 and core.search_runner is not None and core.search_runner.n_live == 0


def test_n_above_one_in_best_mode_is_the_top_n_distinct_reranked_lines(core: EngineCore) -> None:
    [one], [three] = run(core, [asked(UPPERS[0], "best")]), run(core, [asked(UPPERS[0], "best", n=3)])
    assert one.result is not None and three.result is not None
    lowers = [c.lower for c in three.result.candidates]
    assert len(lowers) == 3 and len(set(lowers)) == 3
    assert lowers[0] == one.result.best.lower == three.result.best.lower
    assert three.result.served == "best"


def test_auto_is_best_at_idle_and_compose_is_written_fast(core: EngineCore) -> None:
    auto, composed = run(core, [asked(UPPERS[1], "auto"),
                                replace(compose_request(heads="李明"), quality="best")])
    assert auto.result is not None and auto.result.served == "best"
    assert composed.result is not None and composed.result.served == "fast"


def test_a_bulk_best_search_beside_interactive_work_is_searched_narrower_and_says_so(core: EngineCore) -> None:
    bulk = replace(asked(UPPERS[2], "best"), priority="bulk")
    fast, searched = run(core, [asked(UPPERS[0], "fast"), bulk])
    assert fast.result is not None and fast.result.served == "fast"
    assert searched.result is not None and searched.result.served == "good"
    assert core.runner.n_live == 0 and core.search_runner is not None and core.search_runner.n_live == 0
    [alone] = run(core, [bulk])
    assert alone.result is not None and alone.result.served == "best"


def test_offline_and_celery_quality_answers_say_best_and_greedy_ones_say_fast() -> None:
    """Without a search pool the quality preset's search runs in the main rows; its answer
    still says ``best`` (what ran), as the engine's does."""
    from chunlian.jobs.quality import QualityModel

    [best] = OfflineGenerator.load_quality(capacity=32).generate([couplet_request(UPPERS[0])])
    [greedy] = OfflineGenerator.load(capacity=8).generate([couplet_request(UPPERS[0])])
    assert not isinstance(best, Exception) and best.served == "best"
    assert not isinstance(greedy, Exception) and greedy.served == "fast"
    [job] = QualityModel().run([{"upper": UPPERS[1], "quality": True}])
    assert not isinstance(job, Exception) and job.served == "best"
