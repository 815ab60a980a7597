"""The safety blocklist, folded to simplified Chinese.

Multi-character terms are converted from traditional to simplified forms (``zhconv``) and
matched as substrings. Single-character terms are kept only in the form they were listed:
converting them would turn 區/統/動/臺/幹 into 区/统/动/台/干, banning everyday characters
that carry no vulgar sense on their own (it would drop a large share of the
classical corpus). Simplified single characters on the list (屌, 婊, 淫, ...) stay banned.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from chunlian.text import is_han


def _to_simplified(term: str) -> str:
    import zhconv

    return str(zhconv.convert(term, "zh-cn"))


class Blocklist:
    """Terms that must never appear in training data or generated text."""

    def __init__(self, terms: set[str]) -> None:
        self.terms = frozenset(t for t in terms if t and all(is_han(c) for c in t))
        self.single_chars = frozenset(t for t in self.terms if len(t) == 1)
        self.multi = frozenset(t for t in self.terms if len(t) > 1)
        self.max_len = max((len(t) for t in self.terms), default=0)
        # prefix -> characters that would complete a term after that prefix
        self.completions: dict[str, set[str]] = {}
        for t in self.multi:
            self.completions.setdefault(t[:-1], set()).add(t[-1])

    @classmethod
    def from_file(cls, path: Path) -> Blocklist:
        raw = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        terms: set[str] = set()
        for t in raw:
            if not t:
                continue
            terms.add(t if len(t) == 1 else _to_simplified(t))
        return cls(terms)

    def find(self, text: str) -> str | None:
        """The first blocked term inside ``text``, or None."""
        for ch in text:
            if ch in self.single_chars:
                return ch
        n = len(text)
        for i in range(n):
            for j in range(i + 2, min(n, i + self.max_len) + 1):
                if text[i:j] in self.multi:
                    return text[i:j]
        return None

    def banned_next(self, generated: str) -> set[str]:
        """Characters that, appended to ``generated``, would complete a blocked term."""
        out: set[str] = set()
        for k in range(1, min(len(generated), self.max_len - 1) + 1):
            hit = self.completions.get(generated[-k:])
            if hit:
                out |= hit
        return out


@lru_cache(maxsize=1)
def default_blocklist() -> Blocklist:
    """The blocklist shipped in the package (``resources/blocklist.txt``, MIT)."""
    return Blocklist.from_file(Path(__file__).resolve().parent.parent / "resources" / "blocklist.txt")
