"""Rule-guided decoding: couplet rules as batched logit masks, applied at every step.

Each sequence carries a ``LineState`` (pure Python) that knows, for the next position,
whether a token is forced, which tokens are banned and which tone is wanted. ``Constrainer``
turns a batch of those into one boolean mask and one bias tensor ``[B, V]``.

Rules for the 下联 (hard, hold by construction):
  * same length as the 上联; punctuation forced at the 上联's punctuation positions;
  * repeated-character pattern mirrored: 上[i]==上[j] ⇔ 下[i]==下[j] (a repeat is forced,
    a new 上联 character bans every 下联 character used so far);
  * no Han character of the 上联 anywhere in the 下联 (implies no same-position copy);
  * the last character is 平 (tones 1-2) when the 上联 ends 仄 (3-4). When the last position
    is a repeat of an earlier one, the 平 rule is applied at that earlier position, so the
    repeat rule and the tone rule never conflict;
  * no blocklisted term is completed (single characters always banned), including terms
    completed later by characters the rules will force: choosing 下联[j] also fixes every
    later repeat of position j, so a window (of blocklist length) that those forced
    characters complete is checked when its last undetermined character is chosen
    (``lookahead_banned``); ``banned_next`` alone misses 甲乙 + forced 甲 = 乙甲.
Soft (biases, tunable): 平仄 opposition at even positions and clause ends (``tone_bias``),
and the style's lexicon (``style_bias``).
For a composed 上联: Han characters only, forced head characters, ends 仄, blocklist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

import torch
from torch import Tensor

from chunlian.data.blocklist import Blocklist
from chunlian.model.styles import LEXICONS, STYLE_BIAS, STYLES
from chunlian.model.tokenizer import Tokenizer
from chunlian.text import checked_positions, is_han, tone_class

# which tone to push towards at a position: 0 none, 1 ping, 2 ze
WANT_NONE, WANT_PING, WANT_ZE = 0, 1, 2
_WILD = "?"  # the character being chosen, inside a blocklist window key


@lru_cache(maxsize=8)
def _wildcard_index(blocklist: Blocklist) -> dict[str, frozenset[str]]:
    """Window pattern -> characters completing a term, where ``?`` marks every position
    holding the chosen character: for term 乙甲, ``?甲`` -> {乙} and ``乙?`` -> {甲}."""
    index: dict[str, set[str]] = {}
    for term in blocklist.multi:
        for ch in set(term):
            places = [i for i, c in enumerate(term) if c == ch]
            for r in range(1, len(places) + 1):
                for subset in combinations(places, r):
                    key = "".join(_WILD if i in subset else c for i, c in enumerate(term))
                    index.setdefault(key, set()).add(ch)
    return {k: frozenset(v) for k, v in index.items()}


def lookahead_banned(
    upper: str, lower: str, lower_forced: dict[int, str], blocklist: Blocklist
) -> set[str]:
    """Characters that, chosen for the free 下联 position ``j = len(lower)``, complete a
    blocked term in any window whose other characters are already fixed: chosen earlier,
    forced heads, or forced repeats of position j or of earlier positions."""
    if not blocklist.multi:
        return set()
    j = len(lower)

    def resolve(p: int) -> str:  # "" = not determined yet (or punctuation)
        if not is_han(upper[p]):
            return ""
        root = upper.index(upper[p])
        if root < j:
            return lower[root]
        if root == j:
            return _WILD
        return lower_forced.get(root, "")

    index = _wildcard_index(blocklist)
    n = len(upper)
    copies = [p for p in range(j, n) if upper[p] == upper[j]]
    windows = {
        (s, s + size)
        for p in copies
        for size in range(2, blocklist.max_len + 1)
        for s in range(max(0, p - size + 1), min(p, n - size) + 1)
    }
    out: set[str] = set()
    for s, e in windows:
        chars = [resolve(q) for q in range(s, e)]
        if "" not in chars:
            out |= index.get("".join(chars), frozenset())
    return out


@dataclass
class LineState:
    """Constraint state of one sequence. Phase ``upper`` (compose only), then ``lower``."""

    style: str
    upper: str  # the 上联 so far (complete in phase "lower")
    upper_len: int
    phase: str = "lower"
    lower: str = ""
    upper_forced: dict[int, str] = field(default_factory=dict)
    lower_forced: dict[int, str] = field(default_factory=dict)
    upper_banned: frozenset[str] = frozenset()

    @property
    def done(self) -> bool:
        return self.phase == "lower" and len(self.lower) == self.upper_len

    def next_rule(self, blocklist: Blocklist) -> tuple[str | None, set[str], int, bool]:
        """(forced char, banned chars, wanted tone bias, must be 平/仄 hard) for the next char.

        The last element is a hard tone: ``WANT_PING``/``WANT_ZE`` when the rule is hard.
        """
        if self.phase == "upper":
            i = len(self.upper)
            if i in self.upper_forced:
                return self.upper_forced[i], set(), WANT_NONE, False
            # a composed 上联 repeats no character: repeats read as stutter, not as wordplay
            banned = set(blocklist.banned_next(self.upper)) | set(self.upper_banned) | set(self.upper)
            hard_ze = i == self.upper_len - 1
            return None, banned, WANT_ZE if hard_ze else WANT_NONE, hard_ze
        j = len(self.lower)
        u = self.upper
        if not is_han(u[j]):
            return u[j], set(), WANT_NONE, False
        first = u.index(u[j])
        if first < j:
            return self.lower[first], set(), WANT_NONE, False
        if j in self.lower_forced:
            return self.lower_forced[j], set(), WANT_NONE, False
        banned = {c for c in u if is_han(c)} | {c for c in self.lower if is_han(c)}
        banned |= blocklist.banned_next(self.lower)
        banned |= lookahead_banned(u, self.lower, self.lower_forced, blocklist)
        last = len(u) - 1
        # the 平 ending applies here if this position's repeat group contains the last one
        ends_here = u[last] == u[j]
        if ends_here and tone_class(u[last]) == "ze":
            return None, banned, WANT_PING, True
        want = WANT_NONE
        if j in checked_positions(u):
            t = tone_class(u[j])
            want = WANT_PING if t == "ze" else WANT_ZE if t == "ping" else WANT_NONE
        return None, banned, want, False

    def push(self, ch: str) -> None:
        if self.phase == "upper":
            self.upper += ch
            if len(self.upper) == self.upper_len:
                self.phase = "lower"
        else:
            self.lower += ch


class Constrainer:
    """Vocabulary tables for the rules; builds batched masks and biases on one device."""

    def __init__(self, tok: Tokenizer, blocklist: Blocklist, device: torch.device) -> None:
        self.tok = tok
        self.blocklist = blocklist
        V = len(tok)
        han = torch.zeros(V, dtype=torch.bool)
        ping = torch.zeros(V, dtype=torch.bool)
        ze = torch.zeros(V, dtype=torch.bool)
        for i, ch in enumerate(tok.itos):
            if i < tok.n_special or len(ch) != 1 or not is_han(ch):
                continue
            if ch in blocklist.single_chars:
                continue
            han[i] = True
            t = tone_class(ch)
            ping[i] = t == "ping"
            ze[i] = t == "ze"
        self.allowed_han = han.to(device)
        self.tone_tables = torch.stack([torch.zeros(V, dtype=torch.bool), ping, ze]).to(device)  # [3, V]
        style_bias = torch.zeros(len(STYLES) + 1, V)
        for s, style in enumerate(STYLES):
            for ch in LEXICONS[style]:
                if ch in tok.stoi:
                    style_bias[s, tok.stoi[ch]] = STYLE_BIAS
        self.style_bias = style_bias.to(device)  # last row: no style
        self.style_index = {s: i for i, s in enumerate(STYLES)}
        self.device = device
        _wildcard_index(blocklist)  # built now, not inside the first request's step

    def char_id(self, ch: str) -> int:
        return self.tok.stoi.get(ch, self.tok.unk_id)

    def build(self, states: list[LineState], tone_bias: float) -> tuple[Tensor, Tensor, list[str | None]]:
        """Mask ``[B, V]`` (True = allowed), bias ``[B, V]`` and the forced char per row."""
        B = len(states)
        mask = self.allowed_han.expand(B, -1).clone()
        want = torch.zeros(B, dtype=torch.long)
        hard_rows: list[int] = []
        hard_tone: list[int] = []
        rows: list[int] = []
        cols: list[int] = []
        forced: list[str | None] = []
        for b, st in enumerate(states):
            f, banned, w, hard = st.next_rule(self.blocklist)
            forced.append(f)
            if f is not None:
                continue
            want[b] = w
            if hard:
                hard_rows.append(b)
                hard_tone.append(w)
            for ch in banned:
                i = self.tok.stoi.get(ch)
                if i is not None:
                    rows.append(b)
                    cols.append(i)
        if rows:
            mask[torch.tensor(rows), torch.tensor(cols)] = False
        if hard_rows:
            hr = torch.tensor(hard_rows)
            tone_ok = self.tone_tables[torch.tensor(hard_tone)]  # [H, V]
            restricted = mask[hr] & tone_ok
            # keep the rule only where it leaves a choice (vocabulary holes never dead-end)
            keep = restricted.any(dim=1)
            mask[hr[keep]] = restricted[keep]
        dead = ~mask.any(dim=1)
        if bool(dead.any()):
            # no character satisfies every rule (only possible with a tiny vocabulary):
            # fall back to any Han character rather than emit a special token
            mask[dead] = self.allowed_han
        style_rows = torch.tensor([self.style_index.get(s.style, len(STYLES)) for s in states])
        bias = self.style_bias[style_rows] + tone_bias * self.tone_tables[want].float()
        for b, f in enumerate(forced):
            if f is not None:
                mask[b] = False
                mask[b, self.char_id(f)] = True
        return mask.to(self.device), bias.to(self.device), forced
