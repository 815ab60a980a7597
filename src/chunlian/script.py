"""Traditional-script requests: generated in simplified characters, answered in traditional.

The model's vocabulary is simplified (the corpora are), so a 上联 typed in traditional
characters (爆竹聲聲辭舊歲) reached it half unknown: on the validation split converted to
traditional, greedy BLEU-4 against the traditional golds was 0.60, against 3.29 for the same
pairs in simplified, and the answers came back in simplified. Now a request whose text
changes under simplification is generated from its simplified form and its lines and 横批
are converted back (``zhconv``, with context: 頭髮 / 發財). The user's own characters are
kept as typed: the 上联 of a couplet request, the head characters or keyword of a composed
one.

The couplet rules were enforced on the simplified lines, and conversion keeps them in all
but rare cases (one simplified character can stand for two traditional ones, 发 -> 髮 / 發,
and their tones can differ, 干 gān / 幹 gàn). So the converted lower line is checked
against the typed upper (length and punctuation, repeat pattern, no shared character, the
平 ending where it applies) and the simplified line is answered instead when a check fails.
"""

from __future__ import annotations

from functools import lru_cache

from chunlian.rules import ends_ping, last_han, no_shared_char, repeat_pattern_ok
from chunlian.text import punct_positions, tone_class


@lru_cache(maxsize=8192)
def simplified(text: str) -> str:
    """``text`` in simplified characters (unchanged when conversion would change its length)."""
    import zhconv

    out = str(zhconv.convert(text, "zh-cn"))
    return out if len(out) == len(text) else text


# characters that simplification changes but that simplified text also writes as they are:
# 乾 (乾坤, a given name), 於 (a surname). A name such as 乾宇 is not a traditional request.
ALSO_SIMPLIFIED = frozenset("乾於")


def is_traditional(text: str | None) -> bool:
    """Whether ``text`` holds characters that simplification changes (but ``ALSO_SIMPLIFIED``)."""
    if not text:
        return False
    return any(a != b and a not in ALSO_SIMPLIFIED for a, b in zip(text, simplified(text), strict=True))


def traditional(line: str, keep: dict[int, str] | None = None) -> str:
    """``line`` (simplified) in traditional characters; ``keep`` pins positions to given
    characters (the user's own). A simplified character found at several positions gets
    the traditional form of its first one, so repeats stay repeats."""
    import zhconv

    conv = str(zhconv.convert(line, "zh-hant"))
    if len(conv) != len(line):
        return line
    first: dict[str, str] = {}
    out = []
    for i, (s, t) in enumerate(zip(line, conv, strict=True)):
        t = first.setdefault(s, t)
        out.append((keep or {}).get(i, t))
    return "".join(out)


def rules_hold(upper: str, lower: str, ping_ending: bool) -> bool:
    """The hard couplet rules between two lines as the user will read them (the checks
    ``chunlian eval`` scores, plus punctuation at the same positions)."""
    return (repeat_pattern_ok(upper, lower) and punct_positions(upper) == punct_positions(lower)
            and no_shared_char(upper, lower) and (not ping_ending or ends_ping(lower)))


def converted_couplet(
    upper_s: str, lower_s: str, upper_keep: dict[int, str], lower_keep: dict[int, str],
    typed_upper: str | None = None,
) -> tuple[str, str]:
    """The couplet (simplified lines ``upper_s`` / ``lower_s``) in traditional characters:
    ``typed_upper`` as typed when given, else converted with ``upper_keep`` pinned. The
    lower line falls back to ``lower_s`` when the converted one breaks a rule."""
    upper = typed_upper if typed_upper is not None else traditional(upper_s, upper_keep)
    lower = traditional(lower_s, lower_keep)
    # the last Han characters: a typed final mark (text.FINAL_MARKS) may close both lines
    ping = tone_class(last_han(upper_s)) == "ze" and tone_class(last_han(lower_s)) == "ping"
    # a name's repeated character heads both lines (chunlian.names): the rules hold after it
    cut = int(0 in lower_keep and lower_keep[0] == upper_keep.get(0))
    if rules_hold(upper[cut:], lower[cut:], ping):
        return upper, lower
    if typed_upper is None and rules_hold(upper_s[cut:], lower_s[cut:], ping):
        return upper_s, lower_s
    return upper, lower_s
