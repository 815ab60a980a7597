"""The runner's per-row state: one ``Row`` per occupied KV-cache row, and the ``BeamGroup``
that owns the rows of one beam search (plain data; the runner and ``engine.beams`` move them)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from chunlian.engine.request import SeqSpec
from chunlian.model.decoding import LineState


@dataclass(eq=False)  # rows are told apart by identity: beams of one request look alike
class Row:
    spec: SeqSpec
    state: LineState
    next_id: int  # token to feed at the next decode step
    next_pos: int
    next_role: int
    logprob_sum: float = 0.0
    n_scored: int = 0
    pending_sep: bool = False
    gen: torch.Generator | None = None
    extra: dict[str, float] = field(default_factory=dict)
    retired: bool = False  # finished, kept as padding of a padded batch (``padded_batches``)
    group: BeamGroup | None = None  # set for the rows of a beam search


@dataclass(eq=False)
class BeamGroup:
    """The rows of one beam search, best first. A group starts as its prompt's one row; its
    first choice fans it out to ``width`` rows that share the prompt's keys and values
    (copied once), and each later step reparents the survivors onto their parents' rows.
    Every beam of a request has the 上联's length, so the group finishes in one step."""

    width: int
    rows: list[Row]
    score: Tensor | None = None  # [len(rows)] summed log-probabilities, best first
    n_scored: int = 0  # steps where the model chose (not every beam was forced)
    gen_start: int = 0  # the first generated token's position: the prompt ends before it
