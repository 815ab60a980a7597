"""Cache values: a ``CoupletResult`` as compact JSON text, and back."""

from __future__ import annotations

import json
from typing import Any

from chunlian.types import Couplet, CoupletResult, Served

_SERVED: tuple[Served, ...] = ("best", "good", "fast")


def _couplet(d: dict[str, Any]) -> Couplet:
    return Couplet(
        upper=str(d["upper"]), lower=str(d["lower"]), hengpi=str(d["hengpi"]),
        style=str(d["style"]), score=float(d.get("score", 0.0)),
    )


def _plain(c: Couplet) -> dict[str, object]:
    return {"upper": c.upper, "lower": c.lower, "hengpi": c.hengpi, "style": c.style, "score": c.score}


def encode_result(result: CoupletResult) -> str:
    """Serialise a result for a cache store."""
    return json.dumps(
        {"best": _plain(result.best), "candidates": [_plain(c) for c in result.candidates],
         "model": result.model, "served": result.served},
        ensure_ascii=False, separators=(",", ":"),
    )


def decode_result(text: str) -> CoupletResult:
    """Parse a cached value; raises ``ValueError`` on anything malformed."""
    try:
        d = json.loads(text)
        return CoupletResult(
            best=_couplet(d["best"]),
            candidates=tuple(_couplet(c) for c in d.get("candidates", ())),
            model=str(d.get("model", "")),
            served=_served(d.get("served", "fast")),
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed cache entry: {e}") from e


def _served(value: object) -> Served:
    for s in _SERVED:
        if value == s:
            return s
    raise ValueError(f"unknown served mode {value!r}")
