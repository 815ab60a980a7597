"""Rule-guided decoding: couplet rules as batched logit masks, applied at every step.

Each sequence carries a ``LineState`` (pure Python) that knows, for the next position,
whether a token is forced, which tokens are banned and which tone is wanted. ``Constrainer``
applies a batch of those to the logits ``[B, V]``: one precomputed additive row per sequence
(style and tone biases, ``-inf`` on what is never allowed) plus ``-inf`` on its bans.

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
    (``lookahead_banned``); ``banned_next`` alone misses 甲乙 + forced 甲 = 乙甲. The
    service's list also holds the terms naming another zodiac year (``model.zodiac``).
Soft (biases, tunable): 平仄 opposition at even positions and clause ends (``tone_bias``),
and the style's lexicon (``style_bias``).
For a composed 上联: Han characters only, forced head characters, ends 仄, blocklist.
A line headed by a name's character (``named``) never puts a negative continuation of it
next (``chunlian.names.banned_after_head``: 胡 + 言), puts next only a character that follows
the head in the corpus where the head has such words (``names.allowed_after_head``: no 娜郎),
and keeps the festive register of a name's couplet in both lines (``names.FESTIVE_*`` and the
zodiac's composed terms, ``named_list``). A forced 下联 head may repeat the 上联's (a name
such as 丹丹: ``chunlian.names``): forced characters are never banned.
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
from chunlian.model.zodiac import answering_animals, with_composed
from chunlian.names import (
    FESTIVE_BANNED_CHARS,
    FESTIVE_BANNED_TERMS,
    NOT_A_PERSON,
    allowed_after_head,
    banned_after_head,
)
from chunlian.text import checked_positions, is_han, tone_class

# which tone to push towards at a position: 0 none, 1 ping, 2 ze
WANT_NONE, WANT_PING, WANT_ZE = 0, 1, 2
_NOTHING: frozenset[str] = frozenset()
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


@lru_cache(maxsize=8)  # one object per list: its indexes are built once
def named_list(blocklist: Blocklist) -> Blocklist:
    """What a line headed by a name may not complete: ``blocklist``, the festive terms and
    the zodiac's composed-couplet terms (``model.zodiac.with_composed``)."""
    return with_composed(Blocklist(set(blocklist.terms) | FESTIVE_BANNED_TERMS), blocklist.zodiac_year)


@lru_cache(maxsize=4096)
def _roots(upper: str) -> tuple[int, ...]:
    """For each position, the first position holding the same character (-1: not Han)."""
    return tuple(upper.index(c) if is_han(c) else -1 for c in upper)


@lru_cache(maxsize=4096)
def _han_set(line: str) -> frozenset[str]:
    return frozenset(c for c in line if is_han(c))


@lru_cache(maxsize=4096)
def _lower_fixed(upper: str, zodiac_year: int | None) -> frozenset[str]:
    """What no 下联 position of ``upper`` may write: its Han characters, and the other animals
    when it names the year's (``zodiac.answering_animals``)."""
    return _han_set(upper) | answering_animals(upper, zodiac_year)


# What a 下联 position needs, fixed by the 上联 alone (``_lower_plan``): a forced copy of
# the 上联's punctuation, a forced repeat of an earlier position, or a free choice with the
# tone it wants and whether that tone is hard.
_PUNCT, _REPEAT, _FREE = 0, 1, 2


@lru_cache(maxsize=4096)
def _lower_plan(upper: str) -> tuple[tuple[int, str | int, int, bool], ...]:
    """Per 下联 position: ``(_PUNCT, char, 0, False)``, ``(_REPEAT, root, 0, False)`` or
    ``(_FREE, '', want, hard)``; computed once per 上联, read at every step."""
    roots = _roots(upper)
    checked = checked_positions(upper)
    last = len(upper) - 1
    plan: list[tuple[int, str | int, int, bool]] = []
    for j, c in enumerate(upper):
        if not is_han(c):
            plan.append((_PUNCT, c, WANT_NONE, False))
        elif roots[j] < j:
            plan.append((_REPEAT, roots[j], WANT_NONE, False))
        elif upper[last] == c and tone_class(c) == "ze":
            # the 平 ending applies here: this position's repeat group holds the last one
            plan.append((_FREE, "", WANT_PING, True))
        else:
            t = tone_class(c) if j in checked else ""
            want = WANT_PING if t == "ze" else WANT_ZE if t == "ping" else WANT_NONE
            plan.append((_FREE, "", want, False))
    return tuple(plan)


@lru_cache(maxsize=16384)
def _windows(upper: str, j: int, max_len: int) -> tuple[tuple[int, int], ...]:
    """Every window (start, end) of 2..``max_len`` characters holding a repeat of ``j``."""
    n = len(upper)
    copies = [p for p in range(j, n) if upper[p] == upper[j]]
    return tuple(sorted({
        (s, s + size)
        for p in copies
        for size in range(2, max_len + 1)
        for s in range(max(0, p - size + 1), min(p, n - size) + 1)
    }))


def lookahead_banned(
    upper: str, lower: str, lower_forced: dict[int, str], blocklist: Blocklist
) -> set[str]:
    """Characters that, chosen for the free 下联 position ``j = len(lower)``, complete a
    blocked term in any window whose other characters are already fixed: chosen earlier,
    forced heads, or forced repeats of position j or of earlier positions."""
    if not blocklist.multi:
        return set()
    j = len(lower)
    roots = _roots(upper)
    index = _wildcard_index(blocklist)
    out: set[str] = set()
    for s, e in _windows(upper, j, blocklist.max_len):
        chars: list[str] = []
        # from the end: later positions are the ones most often still undetermined
        for q in range(e - 1, s - 1, -1):
            root = roots[q]
            if root < 0:
                break
            c = lower[root] if root < j else _WILD if root == j else lower_forced.get(root, "")
            if not c:
                break
            chars.append(c)
        else:
            out |= index.get("".join(reversed(chars)), frozenset())
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
    # the forced heads are a name's: what follows a head may not insult it (``chunlian.names``)
    named: bool = False

    @property
    def done(self) -> bool:
        return self.phase == "lower" and len(self.lower) == self.upper_len

    def next_rule(self, blocklist: Blocklist) -> tuple[str | None, set[str], int, bool]:
        """(forced char, banned chars, wanted tone bias, must be 平/仄 hard) for the next char.

        The last element is a hard tone: ``WANT_PING``/``WANT_ZE`` when the rule is hard.
        """
        forced, fixed, extra, want, hard = self.rule_parts(blocklist)
        return forced, set(fixed) | extra, want, hard

    def rule_parts(
        self, blocklist: Blocklist
    ) -> tuple[str | None, frozenset[str], set[str], int, bool]:
        """``next_rule`` with the bans in two parts: ``fixed``, a frozenset shared by every
        step of the line (``_lower_fixed``: the 上联's Han characters; callers may cache per
        object), and ``extra``, this step's own (characters used so far, blocklist completions)."""
        if self.phase == "upper":
            i = len(self.upper)
            if i in self.upper_forced:
                return self.upper_forced[i], _NOTHING, set(), WANT_NONE, False
            # a composed 上联 repeats no character: repeats read as stutter, not as wordplay
            if self.named:
                blocklist = named_list(blocklist)
            extra = blocklist.banned_next(self.upper) | set(self.upper)
            if self.named:
                extra |= FESTIVE_BANNED_CHARS
                if i == 1 and 0 in self.upper_forced:
                    extra |= banned_after_head(self.upper_forced[0]) | NOT_A_PERSON
            hard_ze = i == self.upper_len - 1
            return None, self.upper_banned, extra, WANT_ZE if hard_ze else WANT_NONE, hard_ze
        j = len(self.lower)
        u = self.upper
        kind, arg, want, hard = _lower_plan(u)[j]
        if kind == _PUNCT:
            return str(arg), _NOTHING, set(), WANT_NONE, False
        if kind == _REPEAT:
            return self.lower[int(arg)], _NOTHING, set(), WANT_NONE, False
        if j in self.lower_forced:
            return self.lower_forced[j], _NOTHING, set(), WANT_NONE, False
        if self.named:
            blocklist = named_list(blocklist)
        extra = set(_han_set(self.lower))
        if self.named:
            extra |= FESTIVE_BANNED_CHARS
        extra |= blocklist.banned_next(self.lower)
        extra |= lookahead_banned(u, self.lower, self.lower_forced, blocklist)
        if self.named and j == 1 and 0 in self.lower_forced:
            extra |= banned_after_head(self.lower_forced[0])
        return None, _lower_fixed(u, blocklist.zodiac_year), extra, want, hard

    def allowed_next(self) -> frozenset[str] | None:
        """Only these characters may come next (None: no such rule): the one after a name's
        head, where the corpus attests words that the head opens (``names.allowed_after_head``)."""
        if not self.named:
            return None
        if self.phase == "upper":
            i, forced = len(self.upper), self.upper_forced
        else:
            i, forced = len(self.lower), self.lower_forced
        if i != 1 or 0 not in forced or 1 in forced:
            return None
        return allowed_after_head(forced[0])

    def push(self, ch: str) -> None:
        if self.phase == "upper":
            self.upper += ch
            if len(self.upper) == self.upper_len:
                self.phase = "lower"
        else:
            self.lower += ch


@dataclass(frozen=True)
class Constrained:
    """One step's constrained scores: ``scores [B, V]``, ``top_value``/``top_id [B]``
    (the greedy choice) and the forced character of each row (None: the model chooses)."""

    scores: Tensor
    top_value: Tensor
    top_id: Tensor
    forced: list[str | None]


class Constrainer:
    """Vocabulary tables for the rules; applies them to a batch of logits on one device."""

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
        self._tables: dict[float, Tensor] = {}  # tone_bias -> table (``_table``)
        self._fixed_ids: dict[frozenset[str], list[int]] = {}  # a line's fixed bans as ids
        self._outside: dict[frozenset[str], Tensor] = {}  # an ``allowed_next`` set's complement
        _wildcard_index(blocklist)  # built now, not inside the first request's step
        _wildcard_index(named_list(blocklist))  # so is a name's list (``LineState.named``)

    def _table(self, tone_bias: float) -> Tensor:
        """Additive rows ``[(styles+1) * 3 * 2, V]``: style bias + tone bias, ``-inf`` on
        tokens that are never allowed (special, non-Han, banned single characters) and, in
        the *hard* rows, on the wrong tone. Row ``(style * 3 + want) * 2 + hard``."""
        table = self._tables.get(tone_bias)
        if table is None:
            neg = torch.zeros_like(self.style_bias[0]).masked_fill(~self.allowed_han, float("-inf"))
            rows = []
            for s in range(self.style_bias.shape[0]):
                for w in range(3):
                    soft = self.style_bias[s] + tone_bias * self.tone_tables[w].float() + neg
                    hard = soft.masked_fill(~self.tone_tables[w], float("-inf")) if w else soft
                    rows += [soft, hard]
            table = torch.stack(rows)
            self._tables[tone_bias] = table
        return table

    def apply(self, logits: Tensor, states: list[LineState], tone_bias: float) -> Constrained:
        """Constrained scores ``[B, V]`` (``-inf`` = not allowed), their row maxima and
        the forced char per row.

        One gathered table row per sequence plus an index-put of its banned characters,
        then one max pass: a few passes over ``[B, V]`` whatever the batch holds. A forced
        row's scores are its unconstrained ones: the caller emits the forced character
        without scoring it.
        """
        n_styles = len(STYLES)
        idx: list[int] = []  # table row per sequence; its soft (no hard tone) row is idx & ~1
        rows: list[int] = []
        cols: list[int] = []
        forced: list[str | None] = []
        stoi = self.tok.stoi
        fixed_ids = self._fixed_ids
        only: list[tuple[int, frozenset[str]]] = []
        for b, st in enumerate(states):
            f, fixed, extra, w, hard = st.rule_parts(self.blocklist)
            forced.append(f)
            if f is None and (allowed := st.allowed_next()) is not None:
                only.append((b, allowed))
            s = self.style_index.get(st.style, n_styles)
            if f is not None:
                w, hard = WANT_NONE, False
            idx.append((s * 3 + w) * 2 + int(hard))
            if fixed:
                ids = fixed_ids.get(fixed)
                if ids is None:
                    if len(fixed_ids) > 65536:  # a bound, not an eviction policy
                        fixed_ids.clear()
                    ids = fixed_ids[fixed] = [i for ch in fixed if (i := stoi.get(ch)) is not None]
                rows.extend([b] * len(ids))
                cols.extend(ids)
            for ch in extra:
                i = stoi.get(ch)
                if i is not None:
                    rows.append(b)
                    cols.append(i)
        table = self._table(tone_bias)
        scores = table.index_select(0, torch.tensor(idx, device=self.device)).add_(logits)
        if rows:
            scores[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)] = float("-inf")
        for b, allowed in only:
            scores[b].masked_fill_(self._outside_of(allowed), float("-inf"))
        top_value, top_id = scores.max(dim=1)  # [B]: first of equal maxima, like argmax
        dead = ~torch.isfinite(top_value)
        if bool(dead.any()):
            self._revive(scores, logits, table, dead, idx, rows, cols)
            top_value, top_id = scores.max(dim=1)
        return Constrained(scores, top_value, top_id, forced)

    def _outside_of(self, allowed: frozenset[str]) -> Tensor:
        """A ``[V]`` mask of the tokens not in ``allowed`` (cached per set)."""
        mask = self._outside.get(allowed)
        if mask is None:
            keep = torch.ones(len(self.tok), dtype=torch.bool)
            keep[[i for ch in allowed if (i := self.tok.stoi.get(ch)) is not None]] = False
            mask = self._outside[allowed] = keep.to(self.device)
        return mask

    def _revive(
        self, scores: Tensor, logits: Tensor, table: Tensor, dead: Tensor, idx: list[int],
        rows: list[int], cols: list[int],
    ) -> None:
        """Rows left with no allowed token: drop the hard tone rule first (it yields where
        it leaves no choice), then every ban (only possible with a tiny vocabulary)."""
        for b in dead.nonzero()[:, 0].tolist():
            soft = table[idx[b] & ~1] + logits[b]
            if idx[b] & 1:  # a hard row: retry without the tone restriction
                banned = [c for r, c in zip(rows, cols, strict=True) if r == b]
                retry = soft.clone()
                if banned:
                    retry[torch.tensor(banned, device=self.device)] = float("-inf")
                if bool(torch.isfinite(retry.amax())):
                    scores[b] = retry
                    continue
            scores[b] = soft
