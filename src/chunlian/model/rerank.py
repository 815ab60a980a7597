"""Turn finished sequences into a ``CoupletResult``: n-best reranking and the 横批.

Score of a candidate = mean log-probability of its freely chosen characters (under the
rule-masked distribution) + ``RULE_WEIGHT`` x its 平仄 opposition rate. The hard rules
already hold for every candidate; the score prefers the likelier, better-toned one.
"""

from __future__ import annotations

from typing import Protocol

from chunlian.engine.request import SeqOutput
from chunlian.text import checked_positions, tone_class
from chunlian.types import Couplet, CoupletRequest, CoupletResult

RULE_WEIGHT = 1.0


class HengpiChooser(Protocol):
    def choose(self, upper: str, lower: str, style: str, seed: int | None = None) -> str: ...


def opposition_rate(upper: str, lower: str) -> float:
    """Share of checked positions whose 平仄 oppose (positions with an unknown tone skipped)."""
    hits = total = 0
    for i in checked_positions(upper):
        if i >= len(lower):
            continue
        a, b = tone_class(upper[i]), tone_class(lower[i])
        if a and b:
            total += 1
            hits += a != b
    return hits / total if total else 1.0


def build_result(
    req: CoupletRequest, outputs: list[SeqOutput], hengpi: HengpiChooser | None, model_tag: str
) -> CoupletResult:
    if not outputs:
        raise ValueError("a request finished without output")
    # each score once (this runs on the engine thread for every answer), best first
    scored = sorted(
        ((o.logprob_mean + RULE_WEIGHT * opposition_rate(o.upper, o.lower), o) for o in outputs),
        key=lambda so: (-so[0], so[1].seq_id),
    )
    couplets = []
    for score, o in scored:
        hp = hengpi.choose(o.upper, o.lower, req.style, req.params.seed) if hengpi else ""
        couplets.append(Couplet(o.upper, o.lower, hp, req.style, round(score, 4)))
    return CoupletResult(
        best=couplets[0], candidates=tuple(couplets) if req.params.n > 1 else (), model=model_tag
    )
