"""Plain data the scheduler and the runner exchange (no torch, no I/O).

A ``CoupletRequest`` becomes one ``SeqSpec`` per candidate (``n`` of them): each is one
sequence in one KV-cache slot, from prompt to the last 下联 character. A composed couplet
is one sequence too: it writes the 上联 after its forced head, then the 下联. A beam request
is one ``SeqSpec`` that holds ``width`` rows (its beams) and finishes with every surviving
line (``SeqOutput.beams``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from chunlian.script import is_traditional, simplified
from chunlian.text import is_han, model_form
from chunlian.types import BeamParams, CoupletRequest

_SEED_MIX = 0x9E3779B1


@dataclass(frozen=True)
class SeqSpec:
    """One sequence to generate."""

    seq_id: int
    style: str
    upper: str | None  # the whole 上联, or None when composing
    upper_len: int
    upper_forced: dict[int, str] = field(default_factory=dict)
    lower_forced: dict[int, str] = field(default_factory=dict)
    upper_banned: frozenset[str] = frozenset()
    greedy: bool = True
    seed: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    register: str = "modern"
    # score the chosen tokens (``SeqOutput.logprob_mean``): needed only to rank candidates;
    # a lone candidate skips a log-softmax over the vocabulary at every step
    scored: bool = True
    beam: BeamParams | None = None  # a beam search over ``beam.width`` rows
    named: bool = False  # the forced heads are a name's (``LineState.named``)

    @property
    def composed_search(self) -> bool:
        """A beam search of a whole composed couplet (``engine.composed``): it runs on the
        main rows with the served weights, not in the search pool."""
        return self.beam is not None and self.upper is None

    @property
    def rows(self) -> int:
        """KV-cache rows this sequence holds while it runs."""
        return self.beam.width if self.beam is not None else 1

    @property
    def prompt_chars(self) -> str:
        """Characters fed at prefill after the prefix: the 上联, or a composed one's head."""
        if self.upper is not None:
            return self.upper
        head = ""
        while len(head) in self.upper_forced:
            head += self.upper_forced[len(head)]
        return head

    @property
    def total_steps(self) -> int:
        """Tokens this sequence will emit (prefill's first one included)."""
        if self.upper is not None:
            return self.upper_len
        return 2 * self.upper_len + 1 - len(self.prompt_chars)  # the SEP is emitted too


@dataclass(frozen=True)
class BeamHyp:
    """One final line of a beam: its summed log-probability over the characters the model
    chose (forced ones are not scored) and that sum's mean per scored step. A search of a
    whole composed couplet (``SeqSpec.composed_search``) has its 上联 in ``upper`` too."""

    lower: str
    logprob: float
    logprob_mean: float
    upper: str = ""


@dataclass(frozen=True)
class SeqOutput:
    """A finished sequence: its lines and mean log-probability per emitted Han character
    (0.0 when its spec was not ``scored``). A beam's output is its best line, with every
    surviving line best first in ``beams``."""

    seq_id: int
    upper: str
    lower: str
    logprob_mean: float
    beams: tuple[BeamHyp, ...] = ()


def expand(req: CoupletRequest, first_seq_id: int) -> list[SeqSpec]:
    """The sequences for a request: ``n`` candidates (candidate 0 greedy when unseeded),
    on its text as the model reads it (``model_request``)."""
    req = model_request(req)
    p = req.params
    if p.beam is not None:
        if req.upper is None:
            return [_composed_search(req, first_seq_id, p.beam)]
        return [SeqSpec(seq_id=first_seq_id, style=req.style, upper=req.upper, upper_len=len(req.upper),
                        scored=False, beam=p.beam, lower_forced=_lower_head(req), named=bool(req.heads))]
    specs: list[SeqSpec] = []
    for c in range(p.n):
        greedy = p.seed is None and c == 0
        seed = ((p.seed or 0) * _SEED_MIX + c) & 0x7FFFFFFF
        common = dict(
            seq_id=first_seq_id + c, style=req.style, greedy=greedy, seed=seed,
            temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, scored=p.n > 1,
        )
        if req.upper is not None:
            specs.append(SeqSpec(upper=req.upper, upper_len=len(req.upper), lower_forced=_lower_head(req),
                                 named=bool(req.heads), **common))  # type: ignore[arg-type]
            continue
        upper_forced, lower_forced, banned = _composed_heads(req)
        specs.append(
            SeqSpec(upper=None, upper_len=req.length or 7, upper_forced=upper_forced, lower_forced=lower_forced,
                    upper_banned=banned, named=bool(req.heads), **common)  # type: ignore[arg-type]
        )
    return specs


def _composed_heads(req: CoupletRequest) -> tuple[dict[int, str], dict[int, str], frozenset[str]]:
    """A composed request's forced 上联 and 下联 characters, and the characters its 上联 may
    not hold (the 下联's head: the lines share no character, unless both heads are one)."""
    if req.heads:
        return {0: req.heads[0]}, _lower_head(req), frozenset(ch for ch in req.heads[1:] if is_han(ch))
    return dict(enumerate(req.keyword or "")), {}, frozenset()


def _lower_head(req: CoupletRequest) -> dict[int, str]:
    """The forced 下联 head of a 下联 request that answers a composed 上联 (``engine.composed``:
    ``upper`` and the name's ``heads`` together, the second heading the 下联)."""
    return {0: req.heads[1]} if req.heads and len(req.heads) > 1 else {}


def _composed_search(req: CoupletRequest, seq_id: int, beam: BeamParams) -> SeqSpec:
    """A beam search of a whole composed couplet under its heads or keyword: the 上联 is
    chosen with the 下联 it leads to (a name's second head opens that 下联)."""
    upper_forced, lower_forced, banned = _composed_heads(req)
    return SeqSpec(seq_id=seq_id, style=req.style, upper=None, upper_len=req.length or 7,
                   upper_forced=upper_forced, lower_forced=lower_forced, upper_banned=banned,
                   scored=False, beam=beam, named=bool(req.heads))


def model_request(req: CoupletRequest) -> CoupletRequest:
    """``req`` with its text as the model reads it (itself when it is already): simplified
    characters (``chunlian.script``: the model's vocabulary), the 上联 without its final
    mark and each of its ``——`` / ``……`` one clause mark (``text.model_form``).
    ``rerank.build_result`` turns the generated lines back into what was typed."""
    upper = req.upper and model_form(req.upper)
    if upper == req.upper and not any(is_traditional(t) for t in (req.upper, req.heads, req.keyword)):
        return req
    return replace(req, upper=upper and simplified(upper), heads=req.heads and simplified(req.heads),
                   keyword=req.keyword and simplified(req.keyword))
