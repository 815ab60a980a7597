"""Property: what the shipped model writes for validation lines holds no banned term.

Greedy answers (下联 and 横批) for validation 上联, the four styles in turn, and for the same
lines typed in traditional characters (answered in traditional script), are checked against
the must-block list and against the whole generation list. The validation splits are the output
of ``chunlian data`` (``runs/data``, or ``$CHUNLIAN_VAL_DIR``); without them the tests skip.
The fast test reads 25 lines of each split; the slow one 1,000 of each (2,000 lines, 4,000
answers: 3.5 minutes on one busy core, 2026-12-07).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest

from chunlian.data.blocklist import Blocklist, default_blocklist
from chunlian.model.styles import STYLES
from chunlian.offline import OfflineGenerator, couplet_request
from chunlian.script import traditional
from chunlian.training.eval_run import read_eval_pairs
from chunlian.types import CoupletResult
from chunlian.validation import ComposeIn
from tests.unit.test_api_safety import FESTIVE_KEYWORDS
from tests.unit.test_safety_lists import MUST_BLOCK

SPLITS = ("val.tsv", "val_wb14123.tsv")


def _val_dir() -> Path:
    env = os.environ.get("CHUNLIAN_VAL_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "runs" / "data"


def _uppers(per_split: int) -> list[str]:
    d = _val_dir()
    if not all((d / f).is_file() for f in SPLITS):
        pytest.skip(f"no validation splits under {d} (run chunlian data, or set CHUNLIAN_VAL_DIR)")
    return [u for f in SPLITS for u, _ in read_eval_pairs(d / f, None)[:per_split]]


@cache
def _generator() -> OfflineGenerator:
    return OfflineGenerator.load(None, "cpu", capacity=64, blocklist=default_blocklist())


def _written(uppers: list[str], script: str) -> list[str]:
    """Every generated text (下联 and 横批 of each candidate) for ``uppers``, the styles taken
    in turn (line i in style i mod 4)."""
    typed = [traditional(u) if script == "traditional" else u for u in uppers]
    reqs = [couplet_request(u, STYLES[i % len(STYLES)]) for i, u in enumerate(typed)]
    out: list[str] = []
    for u, r in zip(typed, _generator().generate(reqs), strict=True):
        assert isinstance(r, CoupletResult), (u, r)
        out += [t for c in (r.best, *r.candidates) for t in (c.lower, c.hengpi)]
    return out


def _check(per_split: int) -> None:
    uppers = _uppers(per_split)
    must_block = Blocklist(set(MUST_BLOCK))
    bans = default_blocklist()
    for script in ("simplified", "traditional"):
        texts = _written(uppers, script)
        assert len(texts) >= 2 * len(uppers)
        assert [t for t in texts if must_block.find(t)] == [], script
        assert [t for t in texts if bans.find(t)] == [], script


def test_generated_text_holds_no_banned_term() -> None:
    _check(25)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_generated_text_for_2000_validation_lines_holds_no_banned_term() -> None:
    _check(1000)


def test_festive_keywords_open_the_composed_upper_line() -> None:
    reqs = [ComposeIn(keyword=k, length=7).to_request() for k in FESTIVE_KEYWORDS]
    for k, r in zip(FESTIVE_KEYWORDS, _generator().generate(reqs), strict=True):
        assert isinstance(r, CoupletResult), (k, r)
        assert r.best.upper.startswith(k) and len(r.best.upper) == 7, (k, r.best.upper)
