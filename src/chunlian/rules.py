"""The couplet rules between an upper and a lower line (pure functions, no model).

The decoder enforces them by construction (``model.decoding``); traditional-script answers
are re-checked with them after conversion (``script``); ``chunlian eval`` scores them
(``training.evaluate``, where each metric's definition is written out).
"""

from __future__ import annotations

from chunlian.text import checked_positions, is_han, tone_class

# What the decoder enforces beyond these functions (``model.decoding``: the zodiac rule, the
# banned terms, a composed couplet's rules) changes answers without a new model: this number
# is part of every cache key (``Settings.rules_tag``), so that a deploy never serves answers
# cached under older rules. Bump it with any such change.
DECODING_RULES_VERSION = 2


def last_han(line: str) -> str:
    """The line's last Han character ('' when it has none)."""
    for ch in reversed(line):
        if is_han(ch):
            return ch
    return ""


def repeat_pattern_ok(upper: str, lower: str) -> bool:
    """For all i < j: (上[i]==上[j]) == (下[i]==下[j]); False when lengths differ."""
    if len(upper) != len(lower):
        return False
    n = len(upper)
    return all(
        (upper[i] == upper[j]) == (lower[i] == lower[j]) for i in range(n) for j in range(i + 1, n)
    )


def no_same_position_copy(upper: str, lower: str) -> bool:
    """No Han character equal at the same position."""
    return not any(a == b and is_han(a) for a, b in zip(upper, lower, strict=False))


def no_shared_char(upper: str, lower: str) -> bool:
    """The lines share no Han character."""
    return not ({c for c in upper if is_han(c)} & {c for c in lower if is_han(c)})


def ends_ping(line: str) -> bool:
    """The line's last Han character is 平 (tones 1-2)."""
    return tone_class(last_han(line)) == "ping"


def pingze_share(upper: str, lower: str) -> float | None:
    """Share of the 上联's checked positions whose 平仄 the 下联 opposes; None if none count."""
    checked = 0
    opposed = 0
    for p in checked_positions(upper):
        if p >= len(lower):
            continue
        a, b = tone_class(upper[p]), tone_class(lower[p])
        if not a or not b:
            continue
        checked += 1
        opposed += a != b
    return opposed / checked if checked else None
