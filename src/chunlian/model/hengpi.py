"""Choosing a 横批 (the 4-character horizontal scroll) for a couplet.

The phrases come from ``resources/hengpi.tsv``, a curated, style- and theme-tagged list of
common traditional 横批 (public-domain idioms). A phrase's relevance to a couplet is the sum
of four parts:

(a) **character overlap**: the distinct Han characters the phrase shares with the couplet
    add ``OVERLAP_WEIGHT`` times their rarity weight ``log((N+1)/(df+1)) / log(N+1)``, where
    ``df`` is how many of the ``N`` phrases hold the character (so 春/福/大, found in many
    phrases, say less than 鹤 or 鳌); a few function characters (``STOP_CHARS``) count 0.
    Only the ``MAX_OVERLAP_CHARS`` heaviest shared characters count, and a phrase found
    verbatim in either line loses ``COPY_PENALTY``: a 横批 sums a couplet up, it does not
    repeat four of its characters;
(b) **theme match**: the couplet's Han characters are mapped to themes through
    ``THEME_CHARS``; the couplet's theme profile is the share of its theme hits per theme,
    and a phrase earns ``THEME_WEIGHT`` times the summed share of its themes (its tags plus
    the themes of its own characters);
(c) **style**: ``STYLE_WEIGHT`` when the phrase is tagged with the requested style;
(d) **semantics** (optional): with character vectors (the model's embedding rows),
    ``SEMANTIC_WEIGHT`` times the cosine similarity between the mean vector of the
    couplet's characters and that of the phrase's.

Ties keep the file's order. ``choose`` is deterministic: without a seed it returns the top
phrase; with a seed it draws among the top ``TOP_K`` with probability proportional to
score (the draw is seeded by the seed *and* the couplet, so one seed does not always pick
the same rank). Phrases containing a blocklisted term are never loaded.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from chunlian.data.blocklist import Blocklist
from chunlian.model.styles import STYLES
from chunlian.text import is_han

if TYPE_CHECKING:
    from chunlian.model.checkpoint import LoadedModel

OVERLAP_WEIGHT = 1.0
THEME_WEIGHT = 1.5
STYLE_WEIGHT = 0.5
SEMANTIC_WEIGHT = 0.5
COPY_PENALTY = 3.0
MAX_OVERLAP_CHARS = 2
TOP_K = 5
PHRASE_LEN = 4

# Function characters that carry no topic; sharing one says nothing about relevance.
STOP_CHARS = frozenset("之乎者也矣焉哉而以其于与为的了着不无有是在此亦又且若则乃所")

# Theme -> characters that signal it in a couplet. A character may serve several themes.
THEME_CHARS: dict[str, str] = {
    "spring": "春梅燕柳桃杏莺暖芳绿萌苏花",
    "newyear": "年岁新旧辞元旦夕爆竹节腊除",
    "luck": "福吉祥瑞运星如意顺禧泰",
    "happiness": "喜乐欢笑庆悦欣乐",
    "wealth": "财富金银宝贵利钱鑫余禄玉",
    "business": "商店市贾客货铺经营诚信号",
    "career": "鹏程宏图志业腾飞升展跃步鸿",
    "peace": "安康平宁泰健",
    "family": "家庭门户堂亲孝儿孙子女幼团圆睦居宅母父兄弟",
    "longevity": "寿松鹤柏龄延椿萱",
    "wedding": "婚缘偕鸳鸯凤鸾凰琴瑟郎偶侣",
    "study": "书诗文墨学笔砚翰章读礼德才智榜",
    "landscape": "山水江河湖海云月雨烟霞泉石峰林秋",
    "harvest": "丰谷稻麦粮田耕农收穗果仓",
    "country": "国华夏神州民盛世祖邦疆",
    "harmony": "和睦融谐同",
}
THEMES: tuple[str, ...] = tuple(THEME_CHARS)

_CHAR_THEMES: dict[str, frozenset[str]] = {}
for _theme, _chars in THEME_CHARS.items():
    for _ch in _chars:
        _CHAR_THEMES[_ch] = _CHAR_THEMES.get(_ch, frozenset()) | {_theme}


def themes_of(text: str) -> frozenset[str]:
    """The themes the characters of ``text`` signal (through ``THEME_CHARS``)."""
    out: frozenset[str] = frozenset()
    for ch in text:
        out |= _CHAR_THEMES.get(ch, frozenset())
    return out


def theme_profile(text: str) -> dict[str, float]:
    """Share of ``text``'s theme hits that falls on each theme (sums to 1, or empty)."""
    counts: dict[str, int] = {}
    for ch in text:
        for t in _CHAR_THEMES.get(ch, ()):  # a plain dict: Counter.update costs several times as much
            counts[t] = counts.get(t, 0) + 1
    total = sum(counts.values())
    return {t: n / total for t, n in counts.items()} if total else {}


@dataclass(frozen=True)
class HengpiEntry:
    """One curated phrase with its style and theme tags."""

    phrase: str
    styles: frozenset[str]
    themes: frozenset[str]


def parse_entries(lines: Iterable[str]) -> list[HengpiEntry]:
    """Parse ``hengpi.tsv`` lines (``#`` comments and the header skipped); raise ``ValueError``
    on a malformed row, an unknown style or theme, or a phrase that is not 4 Han characters."""
    out: list[HengpiEntry] = []
    for n, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.startswith("#") or line.startswith("phrase\t"):
            continue
        cols = line.split("\t")
        if len(cols) != 3:
            raise ValueError(f"hengpi line {n}: expected 3 tab-separated columns, got {len(cols)}")
        phrase, styles_s, themes_s = cols
        if len(phrase) != PHRASE_LEN or not all(is_han(c) for c in phrase):
            raise ValueError(f"hengpi line {n}: {phrase!r} is not {PHRASE_LEN} Han characters")
        styles = frozenset(s.strip() for s in styles_s.split(",") if s.strip())
        themes = frozenset(t.strip() for t in themes_s.split(",") if t.strip())
        if not styles or not styles <= set(STYLES):
            raise ValueError(f"hengpi line {n}: bad styles {styles_s!r}")
        if not themes <= set(THEMES):
            raise ValueError(f"hengpi line {n}: unknown themes {sorted(themes - set(THEMES))}")
        out.append(HengpiEntry(phrase, styles, themes))
    return out


def _resource_text(name: str) -> str:
    return resources.files("chunlian").joinpath("resources", name).read_text(encoding="utf-8")


def _default_blocklist() -> Blocklist:
    from chunlian.data.blocklist import default_blocklist

    return default_blocklist()


class HengpiSelector:
    """Ranks the curated phrases by relevance to a couplet and picks one (module docstring)."""

    def __init__(
        self,
        entries: Sequence[HengpiEntry],
        char_vectors: Mapping[str, npt.ArrayLike] | None = None,
        blocklist: Blocklist | None = None,
    ) -> None:
        seen: set[str] = set()
        kept: list[HengpiEntry] = []
        for e in entries:
            if e.phrase in seen or (blocklist is not None and blocklist.find(e.phrase)):
                continue
            seen.add(e.phrase)
            kept.append(e)
        if not kept:
            raise ValueError("no 横批 phrases to choose from")
        self.entries: tuple[HengpiEntry, ...] = tuple(kept)
        self.phrases: tuple[str, ...] = tuple(e.phrase for e in kept)
        n = len(kept)
        df: Counter[str] = Counter()
        for e in kept:
            df.update(set(e.phrase))
        norm = math.log(n + 1)
        self.char_weight: dict[str, float] = {
            c: (0.0 if c in STOP_CHARS else math.log((n + 1) / (k + 1)) / norm)
            for c, k in df.items()
        }
        self._chars = [frozenset(e.phrase) for e in kept]
        self._themes = [e.themes | themes_of(e.phrase) for e in kept]
        # The scoring tables, so that ``scores`` is a few array operations (it runs once per
        # generated couplet on the engine thread): per phrase its characters' columns and
        # rarity weights; [phrase, theme] 0/1; per-style bonus; phrase -> row.
        self._char_col = {c: k for k, c in enumerate(sorted(df))}
        self._theme_mat = np.zeros((n, len(THEMES)))
        for i in range(n):
            for t in self._themes[i]:
                self._theme_mat[i, THEMES.index(t)] = 1.0
        # distinct characters, padded to the longest phrase with a column that is never present
        width = max(len(c) for c in self._chars)
        pad = len(self._char_col)
        self._phrase_cols = np.full((n, width), pad)
        self._phrase_w = np.zeros((n, width))
        for i, chars in enumerate(self._chars):
            for k, c in enumerate(sorted(chars)):
                self._phrase_cols[i, k] = self._char_col[c]
                self._phrase_w[i, k] = self.char_weight[c]
        self._style_bonus = {
            s: np.array([STYLE_WEIGHT if s in e.styles else 0.0 for e in kept]) for s in STYLES
        }
        self._row_of = {p: i for i, p in enumerate(self.phrases)}
        self._vec_row: dict[str, int] = {}
        self._vec_mat: npt.NDArray[np.float64] = np.zeros((0, 0))
        self._phrase_vecs: npt.NDArray[np.float64] | None = None
        if char_vectors is not None:
            self._set_vectors(char_vectors)

    def _set_vectors(self, char_vectors: Mapping[str, npt.ArrayLike]) -> None:
        # the Han characters' vectors as one matrix: a text's mean is one gather and one mean
        vectors = {c: np.asarray(v, dtype=np.float64) for c, v in char_vectors.items()}
        dim = len(next(iter(vectors.values()))) if vectors else 0
        han = [c for c in vectors if len(c) == 1 and is_han(c)]
        self._vec_row = {c: i for i, c in enumerate(han)}
        self._vec_mat = np.stack([vectors[c] for c in han]) if han else np.zeros((0, dim))
        rows = []
        for phrase in self.phrases:
            m = self._mean_unit(phrase)
            rows.append(m if m is not None else np.zeros(dim))
        self._phrase_vecs = np.stack(rows) if dim else None

    def _mean_unit(self, text: str) -> npt.NDArray[np.float64] | None:
        rows = [i for c in text if (i := self._vec_row.get(c)) is not None]
        if not rows:
            return None
        m = self._vec_mat[rows].mean(axis=0)
        norm = float(np.linalg.norm(m))
        return m / norm if norm > 0 else None

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_resources(
        cls,
        char_vectors: Mapping[str, npt.ArrayLike] | None = None,
        blocklist: Blocklist | None = None,
    ) -> HengpiSelector:
        """The shipped phrase list, filtered by ``blocklist`` (default: the shipped one)."""
        entries = parse_entries(_resource_text("hengpi.tsv").splitlines())
        return cls(entries, char_vectors, blocklist or _default_blocklist())

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, blocklist: Blocklist | None = None) -> HengpiSelector:
        """The shipped phrases, with semantic similarity from the model's (tied) embeddings."""
        import torch

        with torch.no_grad():
            emb = loaded.model.tok_emb.weight.detach().float().cpu().numpy()
        tok = loaded.tokenizer
        vectors = {ch: emb[i] for i, ch in enumerate(tok.itos) if i >= tok.n_special}
        return cls.from_resources(vectors, blocklist)

    # ---- scoring -----------------------------------------------------------------------
    def themes_of(self, text: str) -> frozenset[str]:
        """The themes ``text``'s characters signal (the selector's theme lexicon)."""
        return themes_of(text)

    def scores(self, upper: str, lower: str, style: str) -> list[float]:
        """Relevance of every phrase (in ``self.phrases`` order) to the couplet."""
        return self._scores(upper, lower, style).tolist()  # type: ignore[no-any-return]

    def _scores(self, upper: str, lower: str, style: str) -> npt.NDArray[np.float64]:
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r}; expected one of {', '.join(STYLES)}")
        text = "".join(c for c in upper + lower if is_han(c))
        n = len(self.phrases)
        present = np.zeros(len(self._char_col) + 1, dtype=bool)  # last column: padding
        present[[self._char_col[c] for c in text if c in self._char_col]] = True
        # each phrase's own (at most PHRASE_LEN) characters that the couplet shares; the
        # top MAX_OVERLAP_CHARS of their rarity weights
        shared = np.sort(np.where(present[self._phrase_cols], self._phrase_w, 0.0), axis=1)
        overlap = shared[:, -MAX_OVERLAP_CHARS:].sum(axis=1)
        profile = theme_profile(text)
        theme = self._theme_mat @ np.array([profile.get(t, 0.0) for t in THEMES])
        sem = np.zeros(n)
        if self._phrase_vecs is not None:
            cv = self._mean_unit(text)
            if cv is not None:
                sem = self._phrase_vecs @ cv
        out = OVERLAP_WEIGHT * overlap + THEME_WEIGHT * theme + SEMANTIC_WEIGHT * sem
        out = out + self._style_bonus[style]
        copied = {  # phrases found verbatim in either line: penalised once each
            self._row_of[w]
            for line in (upper, lower)
            for k in range(len(line) - PHRASE_LEN + 1)
            if (w := line[k : k + PHRASE_LEN]) in self._row_of
        }
        for row in copied:
            out[row] -= COPY_PENALTY
        return out  # type: ignore[no-any-return]

    def rank(
        self, upper: str, lower: str, style: str, limit: int | None = None
    ) -> list[tuple[str, float]]:
        """Every phrase (or the best ``limit``) with its score, best first (ties keep the
        file's order)."""
        scores = self._scores(upper, lower, style)
        order = np.argsort(-scores, kind="stable")[:limit]
        return [(self.phrases[i], float(scores[i])) for i in order]

    def choose(self, upper: str, lower: str, style: str, seed: int | None = None) -> str:
        """The top phrase, or with ``seed`` a score-weighted draw among the top ``TOP_K``."""
        if seed is None:  # the hot path: the first of equal maxima, no full ranking
            return str(self.phrases[int(np.argmax(self._scores(upper, lower, style)))])
        top = self.rank(upper, lower, style, TOP_K)
        # Scores can be negative (cosine); shift so the weakest still has a small chance.
        low = min(s for _, s in top)
        weights = [s - low + 0.05 for _, s in top]
        rng = random.Random(f"{seed}|{upper}|{lower}|{style}")
        return str(rng.choices([p for p, _ in top], weights=weights, k=1)[0])
