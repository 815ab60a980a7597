"""Driving a ``ModelRunner`` alone, below the engine core: runner-level tests."""

from __future__ import annotations

from chunlian.engine.request import SeqOutput, SeqSpec
from chunlian.engine.runner import ModelRunner


def run_all(runner: ModelRunner, specs: list[SeqSpec]) -> dict[int, SeqOutput]:
    """Generate every spec, admitting new ones in order as rows free up, as the core's
    scheduler does for a batch that waits whole."""
    pending = list(specs)
    out: dict[int, SeqOutput] = {}
    while pending or runner.n_live:
        free = runner.capacity - runner.n_live
        batch: list[SeqSpec] = []
        while pending and pending[0].rows <= free and not (runner.padded_batches and runner.n_live):
            free -= pending[0].rows
            batch.append(pending.pop(0))
        for o in runner.step(batch):
            out[o.seq_id] = o
    return out
