"""Turn finished sequences into a ``CoupletResult``: n-best reranking and the 横批.

Score of a candidate = mean log-probability of its freely chosen characters (under the
rule-masked distribution) + ``RULE_WEIGHT`` x its 平仄 opposition rate. The hard rules
already hold for every candidate; the score prefers the likelier, better-toned one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from chunlian.engine.request import BeamHyp, SeqOutput
from chunlian.script import converted_couplet, is_traditional, traditional
from chunlian.text import checked_positions, tone_class, with_typed_marks
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


def _in_script_of(req: CoupletRequest) -> Callable[[str, str], tuple[str, str]] | None:
    """For a request typed in traditional characters, the conversion of its generated
    (simplified) lines back to them, keeping what the user typed (``chunlian.script``);
    None for a simplified one."""
    if req.upper is not None:
        if not is_traditional(req.upper):
            return None
        typed = req.upper
        return lambda u, lo: converted_couplet(u, lo, {}, {}, typed_upper=typed)
    if req.heads and is_traditional(req.heads):
        up_keep = {0: req.heads[0]}
        low_keep = {0: req.heads[1]} if len(req.heads) > 1 else {}
    elif req.keyword and is_traditional(req.keyword):
        up_keep, low_keep = dict(enumerate(req.keyword)), {}
    else:
        return None
    return lambda u, lo: converted_couplet(u, lo, up_keep, low_keep)


def build_result(
    req: CoupletRequest, outputs: list[SeqOutput], hengpi: HengpiChooser | None, model_tag: str,
    ranked: bool = False,
) -> CoupletResult:
    """The answer from a request's finished sequences, best first by score (``ranked``:
    in the given order, as a beam's reranking left them)."""
    if not outputs:
        raise ValueError("a request finished without output")
    # each score once (this runs on the engine thread for every answer), best first
    scored = [(o.logprob_mean + RULE_WEIGHT * opposition_rate(o.upper, o.lower), o) for o in outputs]
    if not ranked:
        scored.sort(key=lambda so: (-so[0], so[1].seq_id))
    couplets = []
    back = _in_script_of(req)
    typed = req.upper
    for score, o in scored:
        hp = hengpi.choose(o.upper, o.lower, req.style, req.params.seed) if hengpi else ""
        upper, lower = o.upper, o.lower
        if typed is not None:  # the typed ——, …… and final mark back (text.model_form)
            upper, lower = with_typed_marks(upper, typed), with_typed_marks(lower, typed)
        if back is not None:
            upper, lower = back(upper, lower)
        couplets.append(Couplet(upper, lower, hp if back is None else traditional(hp), req.style,
                                round(score, 4)))
    return CoupletResult(
        best=couplets[0], candidates=tuple(couplets) if req.params.n > 1 else (), model=model_tag
    )


def in_typed_script(req: CoupletRequest, result: CoupletResult) -> CoupletResult:
    """``result``, written in simplified characters for a request of its own, in the script
    ``req`` was typed in (a composed couplet's two stages: ``engine.composed``)."""
    back = _in_script_of(req)
    if back is None:
        return result

    def typed(c: Couplet) -> Couplet:
        upper, lower = back(c.upper, c.lower)
        return replace(c, upper=upper, lower=lower, hengpi=traditional(c.hengpi))

    return replace(result, best=typed(result.best), candidates=tuple(typed(c) for c in result.candidates))


def diverse(outputs: list[SeqOutput], n: int) -> list[SeqOutput]:
    """The ``n`` lines a search answers with, from its ranked, distinct ``outputs``: the best
    first, then, in rank order, those whose 下联 differs from every one taken in more than
    half its positions, then the rest in rank order. A search's next lines mostly change one or
    two characters of its best (英雄伟业国威扬, 英雄伟业国光新): as "another couplet" (the
    page's 换一副) they read as the same one."""
    taken: list[SeqOutput] = []
    for o in outputs:
        if len(taken) == n:
            return taken
        if all(_differs(o, t) for t in taken):
            taken.append(o)
    return taken + [o for o in outputs if o not in taken][: n - len(taken)]


def _differs(a: SeqOutput, b: SeqOutput) -> bool:
    """Whether two couplets differ: another 上联, or 下联 unlike in more than half their positions."""
    if a.upper != b.upper:
        return True
    return sum(x != y for x, y in zip(a.lower, b.lower, strict=False)) * 2 > len(a.lower)


def searched_lines(out: SeqOutput, ranked: Sequence[BeamHyp] | None, n: int) -> list[SeqOutput]:
    """A finished search's ``n`` lines (``diverse``) from its distinct ones, in their reranked
    order (``ranked``), else in the beam's own; a composed 上联's search has its line in ``upper``."""
    hyps = ranked if ranked is not None else out.beams
    lines = [SeqOutput(out.seq_id, h.upper or out.upper, h.lower, h.logprob_mean) for h in hyps]
    return diverse(distinct(lines), n)


def distinct(outputs: list[SeqOutput]) -> list[SeqOutput]:
    """``outputs`` without repeated lines, first kept (a search's dead slots repeat its best)."""
    first: dict[tuple[str, str], SeqOutput] = {}
    for o in outputs:
        first.setdefault((o.upper, o.lower), o)
    return list(first.values())
