"""What a load test sends: the upper lines, the request plan, the target URL.

``RequestPlan`` mixes *fresh* requests (never seen by the service in this run) with repeats
of a small hot set, deterministically for a seed (``chunlian.bench.loadgen`` says how).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chunlian.data.samples import sample_uppers

STYLES = ("traditional", "business", "family", "literary")
DEFAULT_URL = "http://127.0.0.1:8000"
ENDPOINT = "/v1/couplets"
WARMUP_SEED_BASE = 1 << 40
FRESH_SEED_STRIDE = 1000  # fresh requests of one plan seed before the next seed's sequence  # warm-up requests are seeded from here: never in a measured plan

# ---- input lines ------------------------------------------------------------------------------


def load_lines(path: Path | None = None) -> list[str]:
    """Upper lines from ``path`` (one a line, ``#`` comments; in a .tsv the first column,
    its ``upper`` header skipped), or the built-in sample of 400 real lines."""
    if path is None:
        return sample_uppers()
    lines: list[str] = []
    seen: set[str] = set()
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.split("\t", 1)[0].strip()
        if not text or text.startswith("#") or text == "upper" or text in seen:
            continue
        seen.add(text)
        lines.append(text)
    if not lines:
        raise ValueError(f"{path}: no upper lines")
    return lines


def check_url(url: str) -> str:
    """``url`` without a trailing slash; an http(s) URL with a host, else ``ValueError``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


# ---- what to send -----------------------------------------------------------------------------


@dataclass
class RequestPlan:
    """The deterministic sequence of request bodies of one run (see the module docstring)."""

    lines: list[str]
    unique_ratio: float = 1.0
    hot_size: int = 16
    seed: int = 0
    sent_unique: int = 0
    sent_hot: int = 0
    sent_seeded: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.unique_ratio <= 1.0:
            raise ValueError(f"unique_ratio must be within 0..1, got {self.unique_ratio}")
        if self.unique_ratio < 1.0 and self.hot_size < 1:
            raise ValueError("a hot set of at least one line is needed when unique_ratio < 1")
        hot = min(self.hot_size, len(self.lines) - 1) if self.unique_ratio < 1.0 else 0
        self.hot = self.lines[len(self.lines) - hot:] if hot else []
        self.fresh = self.lines[: len(self.lines) - hot]
        if not self.fresh:
            raise ValueError("no lines left for fresh requests")
        self._rng = random.Random(self.seed)

    @property
    def greedy_pool(self) -> int:
        """Fresh requests available before seeds are needed."""
        return len(self.fresh) * len(STYLES)

    def unique_body(self, k: int) -> dict[str, Any]:
        """The ``k``-th fresh request. Plans with another ``seed`` start far along the same
        sequence (seeded requests), so a second run with a new seed is fresh to a server that
        has answered the first."""
        k += self.seed * FRESH_SEED_STRIDE * self.greedy_pool
        n = len(self.fresh)
        line, rnd = self.fresh[k % n], k // n
        body: dict[str, Any] = {"upper": line, "style": STYLES[rnd % len(STYLES)]}
        if rnd >= len(STYLES):
            body["seed"] = rnd // len(STYLES)
        return body

    def next_body(self) -> dict[str, Any]:
        if self.unique_ratio >= 1.0 or self._rng.random() < self.unique_ratio:
            body = self.unique_body(self.sent_unique)
            self.sent_unique += 1
            self.sent_seeded += "seed" in body
            return body
        self.sent_hot += 1
        return {"upper": self._rng.choice(self.hot)}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self.next_body()

    def stats(self) -> dict[str, Any]:
        return {"unique_ratio": self.unique_ratio, "hot_size": len(self.hot),
                "lines": len(self.lines), "sent_fresh": self.sent_unique,
                "sent_hot": self.sent_hot, "sent_fresh_seeded": self.sent_seeded}


def warmup_body(lines: list[str], k: int) -> dict[str, Any]:
    """A warm-up request: seeded from ``WARMUP_SEED_BASE``, never in a measured plan."""
    return {"upper": lines[k % len(lines)], "seed": WARMUP_SEED_BASE + k}
