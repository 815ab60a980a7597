"""Couplet metrics for ``chunlian eval`` (pure functions: no model runs here).

``compute_metrics(uppers, hyps, refs)`` returns these keys (the caller adds ``seconds``);
rates are in 0..1, each over the pairs named, and a rate with no pair to count is 0.0:

``pairs``
    Number of (上联, hypothesis 下联, reference 下联) triples.
``bleu4`` / ``bleu1``
    sacrebleu corpus BLEU with ``tokenize="zh"`` (Chinese characters are single tokens),
    one reference per pair, on the 0-100 scale; ``bleu1`` uses ``max_ngram_order=1``.
``length_ok``
    ``len(hyp) == len(upper)``.
``repeat_pattern_ok``
    For all i < j: ``(上[i] == 上[j]) == (下[i] == 下[j])`` over every character,
    punctuation included; false when the lengths differ.
``no_same_position_copy``
    No Han character of the 上联 stands at the same position in the 下联.
``no_shared_char``
    The two lines share no Han character at all.
``ends_ping``
    The last Han character of the 下联 is 平 (``chunlian.text.tone_class`` == "ping":
    pypinyin tones 1-2), over all pairs.
``ends_ping_when_upper_ze``
    The same, over the pairs whose 上联's last Han character is 仄 (tones 3-4), where the
    rule applies.
``pingze_opposition``
    Per pair, the checked positions of the 上联 (``text.checked_positions``:
    within each clause, split at non-Han characters, the even positions counted 1-based
    from the clause start, and the clause's last character); positions where either
    line's character has no tone class (neutral tone, unknown, non-Han, or beyond the
    hypothesis) are skipped; the pair's score is the share of the remaining positions
    whose classes differ. Averaged over the pairs with at least one such position.

``random_real_baseline`` builds the "random real 下联" baseline and ``hengpi_agreement``
scores 横批 selection against ``hengpi_triples.tsv``; see their docstrings.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from chunlian.rules import (
    ends_ping,
    last_han,
    no_same_position_copy,
    no_shared_char,
    pingze_share,
    repeat_pattern_ok,
)
from chunlian.text import is_han, tone_class

if TYPE_CHECKING:
    from chunlian.model.hengpi import HengpiSelector

METRIC_KEYS: tuple[str, ...] = (
    "pairs", "bleu4", "bleu1", "length_ok", "repeat_pattern_ok", "no_same_position_copy",
    "no_shared_char", "ends_ping", "ends_ping_when_upper_ze", "pingze_opposition",
)


def _rate(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


# sacrebleu is the ``eval`` extra: a serving install goes without it
EVAL_EXTRA = "chunlian eval needs sacrebleu (BLEU): pip install 'chunlian[eval]'"


def can_score() -> bool:
    """Whether sacrebleu (the ``eval`` extra) is installed."""
    return importlib.util.find_spec("sacrebleu") is not None


def _bleu(hyps: list[str], refs: list[str], order: int) -> float:
    from sacrebleu.metrics.bleu import BLEU

    return float(BLEU(tokenize="zh", max_ngram_order=order).corpus_score(hyps, [refs]).score)


def compute_metrics(uppers: list[str], hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Every ``eval`` metric except ``seconds`` (definitions in the module docstring)."""
    if not len(uppers) == len(hyps) == len(refs):
        raise ValueError(
            f"uppers, hyps and refs differ in length: {len(uppers)}, {len(hyps)}, {len(refs)}"
        )
    n = len(uppers)
    if n == 0:
        return dict.fromkeys(METRIC_KEYS, 0.0)
    pairs = list(zip(uppers, hyps, strict=True))
    ze_pairs = [(u, h) for u, h in pairs if tone_class(last_han(u)) == "ze"]
    shares = [s for u, h in pairs if (s := pingze_share(u, h)) is not None]
    return {
        "pairs": float(n),
        "bleu4": _bleu(hyps, refs, 4),
        "bleu1": _bleu(hyps, refs, 1),
        "length_ok": _rate([len(h) == len(u) for u, h in pairs]),
        "repeat_pattern_ok": _rate([repeat_pattern_ok(u, h) for u, h in pairs]),
        "no_same_position_copy": _rate([no_same_position_copy(u, h) for u, h in pairs]),
        "no_shared_char": _rate([no_shared_char(u, h) for u, h in pairs]),
        "ends_ping": _rate([ends_ping(h) for _, h in pairs]),
        "ends_ping_when_upper_ze": _rate([ends_ping(h) for _, h in ze_pairs]),
        "pingze_opposition": sum(shares) / len(shares) if shares else 0.0,
    }


def random_real_baseline(
    uppers: list[str], refs: list[str], pool_lowers: Sequence[str], seed: int
) -> list[str]:
    """For each pair, a random real 下联 from ``pool_lowers`` with the 上联's length.

    Never the pair's own reference when another line of that length exists. When the pool
    has no line of the 上联's length, the reference's length is tried, then the nearest
    length in the pool (the shorter one on a tie), so every pair gets a real line.
    Deterministic for a given ``seed``.
    """
    if len(uppers) != len(refs):
        raise ValueError(f"uppers and refs differ in length: {len(uppers)}, {len(refs)}")
    by_len: dict[int, list[str]] = {}
    for line in pool_lowers:
        if line:
            by_len.setdefault(len(line), []).append(line)
    if not by_len:
        raise ValueError("the pool of lower lines is empty")
    lengths = sorted(by_len)
    rng = random.Random(seed)
    out: list[str] = []
    for upper, ref in zip(uppers, refs, strict=True):
        if len(upper) in by_len:
            cands = by_len[len(upper)]
        elif len(ref) in by_len:
            cands = by_len[len(ref)]
        else:
            cands = by_len[min(lengths, key=lambda k: (abs(k - len(upper)), k))]
        i = rng.randrange(len(cands))
        if cands[i] == ref and len(cands) > 1:
            i = (i + 1 + rng.randrange(len(cands) - 1)) % len(cands)
        out.append(cands[i])
    return out


def hengpi_agreement(
    selector: HengpiSelector,
    triples: Iterable[tuple[str, str, str]],
    style: str = "traditional",
    draws: int = 20,
    seed: int = 0,
) -> dict[str, float]:
    """How often the chosen 横批 agrees with the real one on ``(upper, lower, hengpi)`` rows.

    ``char_overlap``: the choice shares at least one Han character with the real 横批.
    ``theme_overlap``: the two share at least one theme of the selector's theme lexicon
    (``selector.themes_of`` on both phrases' characters; tags are not used, since the real
    横批 has none). ``random_*``: the same rates for a uniformly random phrase of the
    selector's list, averaged over ``draws`` seeded draws. Every row counts, whatever the
    real 横批's length.
    """
    rows = [(u, lo, h) for u, lo, h in triples if h]
    out: dict[str, float] = {
        "rows": float(len(rows)), "char_overlap": 0.0, "theme_overlap": 0.0,
        "random_char_overlap": 0.0, "random_theme_overlap": 0.0,
    }
    if not rows:
        return out

    def agree(choice: str, real: str) -> tuple[bool, bool]:
        chars = bool({c for c in choice if is_han(c)} & set(real))
        themes = bool(selector.themes_of(choice) & selector.themes_of(real))
        return chars, themes

    chosen = [agree(selector.choose(u, lo, style), h) for u, lo, h in rows]
    out["char_overlap"] = _rate([c for c, _ in chosen])
    out["theme_overlap"] = _rate([t for _, t in chosen])
    rng = random.Random(seed)
    phrases = selector.phrases
    char_sum = theme_sum = 0.0
    for _ in range(draws):
        picks = [agree(rng.choice(phrases), h) for _, _, h in rows]
        char_sum += _rate([c for c, _ in picks])
        theme_sum += _rate([t for _, t in picks])
    out["random_char_overlap"] = char_sum / draws
    out["random_theme_overlap"] = theme_sum / draws
    return out
