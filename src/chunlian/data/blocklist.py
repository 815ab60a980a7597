"""The safety list: what is never written, never trained on and never accepted from users.

The shipped list is ``resources/blocklist.tsv``: every term of the upstream list
(``resources/blocklist.upstream.txt``, MIT, v-zich/couplet-clean-dataset) with a category and
a decision, made by ``scripts/audit_blocklist.py`` (docs/reference/safety-filter.md). Ordinary
words on the upstream list (万里, 中国, 圆满, 手机: words that coincide with a name or with part
of a sensitive phrase) are removed; the rest is kept, in one of five categories. Each place
applies its own part of it:

* generation (``default_blocklist``): every kept term - no generated line completes one;
* training (``training_blocklist``): the same terms - a pair holding one is dropped, so the
  model never learns what it may not write;
* user input (``input_blocklist``): sexual or vulgar terms and insults only - a user's own
  words (a name, a keyword, a 上联) are answered unless they are vulgar or insulting.

Terms are matched as substrings of simplified text, and in their listed traditional forms
(precomputed in the file, so loading converts nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from chunlian.text import is_han

CATEGORIES = ("sexual", "insult", "violence", "drugs", "political", "ordinary")
INPUT_CATEGORIES = frozenset({"sexual", "insult"})
_AUDITED = Path(__file__).resolve().parent.parent / "resources" / "blocklist.tsv"


def _to_simplified(term: str) -> str:
    import zhconv

    return str(zhconv.convert(term, "zh-cn"))


class Blocklist:
    """Terms that must never appear in training data or generated text."""

    def __init__(self, terms: set[str] | frozenset[str], zodiac_year: int | None = None) -> None:
        self.terms = frozenset(t for t in terms if t and all(is_han(c) for c in t))
        # the campaign year whose off-year zodiac terms it holds (``model.zodiac``), if any
        self.zodiac_year = zodiac_year
        self.single_chars = frozenset(t for t in self.terms if len(t) == 1)
        self.multi = frozenset(t for t in self.terms if len(t) > 1)
        self.max_len = max((len(t) for t in self.terms), default=0)
        # the proper prefixes of the multi-character terms: ``find`` stops extending a
        # substring that starts no term (one lookup per character of most lines)
        self._prefixes = frozenset(t[:k] for t in self.multi for k in range(2, len(t)))
        # prefix -> characters that would complete a term after that prefix
        self.completions: dict[str, set[str]] = {}
        for t in self.multi:
            self.completions.setdefault(t[:-1], set()).add(t[-1])

    @classmethod
    def from_file(cls, path: Path) -> Blocklist:
        """A plain list, one term a line; multi-character terms are folded to simplified
        characters, single characters kept as listed (folding 區/統/動 would ban 区/统/动)."""
        raw = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        return cls({t if len(t) == 1 else _to_simplified(t) for t in raw if t})

    def find(self, text: str) -> str | None:
        """The first blocked term inside ``text`` (single characters first, then by start and
        length), or None."""
        if not self.single_chars.isdisjoint(text):
            return next(ch for ch in text if ch in self.single_chars)
        n = len(text)
        for i in range(n - 1):
            for j in range(i + 2, min(n, i + self.max_len) + 1):
                part = text[i:j]
                if part in self.multi:
                    return part
                if part not in self._prefixes:
                    break
        return None

    def banned_next(self, generated: str) -> set[str]:
        """Characters that, appended to ``generated``, would complete a blocked term."""
        out: set[str] = set()
        for k in range(1, min(len(generated), self.max_len - 1) + 1):
            hit = self.completions.get(generated[-k:])
            if hit:
                out |= hit
        return out


@dataclass(frozen=True)
class Entry:
    """One row of the audited list."""

    term: str  # as listed upstream (or added)
    simplified: str  # the form matched
    category: str  # one of CATEGORIES
    keep: bool  # False: removed from every place
    pairs: int  # corpus pairs holding it (upstream matching)
    forms: tuple[str, ...]  # its other written forms, matched too
    reason: str  # a code explained in the file's header


def read_audited(path: Path = _AUDITED) -> list[Entry]:
    """The rows of an audited list file (``#`` lines and the header skipped)."""
    out: list[Entry] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#") or line.startswith("term\t"):
            continue
        term, simp, cat, decision, pairs, forms, reason = line.split("\t")
        if cat not in CATEGORIES or decision not in ("keep", "remove"):
            raise ValueError(f"{path}: bad row {line!r}")
        out.append(Entry(term, simp, cat, decision == "keep", int(pairs), tuple(forms.split()), reason))
    return out


def bans(entries: list[Entry], categories: frozenset[str] | set[str]) -> Blocklist:
    """The kept terms of ``categories``, in every listed form."""
    terms: set[str] = set()
    for e in entries:
        if e.keep and e.category in categories:
            terms.add(e.simplified)
            terms.update(e.forms)
    return Blocklist(terms)


@lru_cache(maxsize=1)
def _entries() -> tuple[Entry, ...]:
    return tuple(read_audited())


@lru_cache(maxsize=1)
def default_blocklist() -> Blocklist:
    """The bans on generated text: every kept term of the shipped list."""
    return bans(list(_entries()), set(CATEGORIES) - {"ordinary"})


def training_blocklist() -> Blocklist:
    """What a training pair may not hold: the generation bans (one object)."""
    return default_blocklist()


@lru_cache(maxsize=1)
def input_blocklist() -> Blocklist:
    """What a user's names, keywords and 上联 may not hold: the vulgar terms and insults."""
    return bans(list(_entries()), INPUT_CATEGORIES)
