"""Warm-up: generate and cache the hot requests before (or while) traffic comes.

An entry of 1-4 Chinese characters is a keyword: it is composed (traditional style) at
both line lengths, 7 and 5. A longer entry is a 上联. Bad entries are skipped with a log
line, never fatal.

* ``warm_local`` runs at start-up through the service's own cache-and-engine path;
  readiness waits for it.
* ``warmup_remote`` warms a running service or a cluster behind a load balancer over
  HTTP (``chunlian warmup --url URL [--file F]``), in batches of up to 256 items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from chunlian.api.auth import API_KEY_HEADER
from chunlian.api.schemas import MAX_BATCH_ITEMS, ComposeIn, CoupletIn
from chunlian.api.service import CoupletService
from chunlian.errors import ChunlianError, InvalidInput
from chunlian.text import han_count, normalize
from chunlian.types import CoupletRequest

log = logging.getLogger("chunlian.warmup")

KEYWORD_MAX = 4
KEYWORD_LENGTHS = (7, 5)
WARMUP_STYLE = "traditional"


def warmup_bodies(entries: Iterable[str]) -> list[dict[str, Any]]:
    """The API request bodies for ``entries`` (keywords composed at both lengths)."""
    bodies: list[dict[str, Any]] = []
    for raw in entries:
        text = normalize(raw)
        if not text:
            continue
        if len(text) <= KEYWORD_MAX and han_count(text) == len(text):
            bodies.extend(
                {"keyword": text, "length": n, "style": WARMUP_STYLE}
                for n in KEYWORD_LENGTHS if len(text) < n
            )
        else:
            bodies.append({"upper": text, "style": WARMUP_STYLE})
    return bodies


def warmup_requests(entries: Iterable[str]) -> list[CoupletRequest]:
    """Engine requests for ``entries``; invalid entries are logged and skipped."""
    out: list[CoupletRequest] = []
    for body in warmup_bodies(entries):
        try:
            model = ComposeIn.model_validate(body) if "keyword" in body else CoupletIn.model_validate(body)
            out.append(model.to_request())
        except (InvalidInput, ValueError) as e:
            log.warning("skipping warm-up entry %r: %s", body.get("upper") or body.get("keyword"), e)
    return out


async def warm_local(service: CoupletService, entries: Sequence[str], concurrency: int = 64) -> int:
    """Generate and cache every entry not already cached; returns how many succeeded."""
    requests = warmup_requests(entries)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(req: CoupletRequest) -> bool:
        async with gate:
            try:
                await service.answer(req)
            except ChunlianError as e:
                log.warning("warm-up request failed (%s): %s", e.code, e)
                return False
            return True

    done = await asyncio.gather(*(one(r) for r in requests))
    ok = sum(done)
    log.info("warm-up done: %d of %d requests", ok, len(requests))
    return ok


@dataclass
class WarmupReport:
    """What a remote warm-up achieved."""

    requested: int = 0
    ok: int = 0
    cached: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        """Plain form for JSON output."""
        return {"requested": self.requested, "ok": self.ok, "cached": self.cached,
                "failed": self.failed, "errors": self.errors[:20]}


def read_warmup_file(path: Path) -> list[str]:
    """Entries from a text file: one per line; blank lines and ``#`` comments ignored."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]


async def warmup_remote(
    url: str,
    items: Sequence[str],
    *,
    timeout_s: float = 120.0,
    client: httpx.AsyncClient | None = None,
    api_key: str | None = None,
) -> WarmupReport:
    """Warm the service at ``url`` (its base URL) with ``items`` via ``/v1/couplets/batch``
    (which needs ``api_key`` when the service has keys configured)."""
    bodies = warmup_bodies(items)
    report = WarmupReport(requested=len(bodies))
    endpoint = url.rstrip("/") + "/v1/couplets/batch"
    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout_s)
    headers = {API_KEY_HEADER: api_key} if api_key else {}
    try:
        for i in range(0, len(bodies), MAX_BATCH_ITEMS):
            chunk = bodies[i : i + MAX_BATCH_ITEMS]
            try:
                resp = await http.post(endpoint, json={"items": chunk}, headers=headers)
            except httpx.HTTPError as e:
                report.failed += len(chunk)
                report.errors.append(f"{type(e).__name__}: {e}")
                continue
            if resp.status_code != 200:
                report.failed += len(chunk)
                report.errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                continue
            for res in resp.json().get("results", []):
                if "error" in res:
                    report.failed += 1
                    report.errors.append(f"{res['error'].get('code')}: {res['error'].get('message')}")
                else:
                    report.ok += 1
                    report.cached += bool(res.get("cached"))
    finally:
        if own:
            await http.aclose()
    return report
