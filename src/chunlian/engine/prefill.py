"""How a prefill is split into forwards (or groups of a fused step): a cost model.

Padding every prompt of an admitted group to the longest one wastes compute on short
lines; splitting costs a forward's (or a group's) fixed overhead. ``prefill_chunks``
minimises padded tokens plus that fixed cost, in prompt tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from chunlian.engine.request import SeqSpec

# Cost model of one prefill forward: its fixed cost expressed in prompt tokens (the fixed
# cost over the cost of one more token; docs/performance.md gives the timings): a split pays
# for itself when it saves more padded tokens than this.
PREFILL_FIXED_TOKENS = 56
# The same for one more group of a fused step (``ModelRunner.step``): only its attention
# ops are its own, the linear layers are shared, so it is much smaller; chosen by paired
# runs on the 800-line mix (docs/performance.md).
GROUP_FIXED_TOKENS = 12


def prefill_chunks(
    specs: list[SeqSpec], length: Callable[[SeqSpec], int], fixed_tokens: int = PREFILL_FIXED_TOKENS
) -> list[list[SeqSpec]]:
    """Split a prefill into runs of similar prompt length, minimising padded tokens plus a
    fixed cost per forward or group (dynamic programming over the distinct lengths, sorted)."""
    by_len: dict[int, list[SeqSpec]] = {}
    for s in specs:
        by_len.setdefault(length(s), []).append(s)
    lens = sorted(by_len)
    counts = [len(by_len[n]) for n in lens]
    # best[j]: cost of lengths[:j]; a chunk lens[i:j] costs FIXED + lens[j-1] * its rows
    best = [0.0] + [math.inf] * len(lens)
    cut = [0] * (len(lens) + 1)
    for j in range(1, len(lens) + 1):
        rows = 0
        for i in range(j - 1, -1, -1):
            rows += counts[i]
            c = best[i] + fixed_tokens + lens[j - 1] * rows
            if c < best[j]:
                best[j], cut[j] = c, i
    chunks: list[list[SeqSpec]] = []
    j = len(lens)
    while j > 0:
        i = cut[j]
        chunks.append([s for n in lens[i:j] for s in by_len[n]])
        j = i
    return chunks[::-1]
