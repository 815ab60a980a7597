"""Warm-up: generate and cache the hot requests before (or while) traffic comes.

An entry of 1-4 Chinese characters is a keyword: it is composed (traditional style) at
both line lengths, 7 and 5. An entry ``name:王秀英`` is a name: composed as a 藏头 couplet at
the page's default length (7) and style, in the best mode. A longer entry is a 上联. Bad
entries are skipped with a log line, never fatal.

Every entry is warmed as the campaign page asks for it: ``n`` = ``PAGE_CANDIDATES``
couplets (its 换一副 shows them in turn), so a page request is a cache hit; a request with
another ``n`` is another key.

* ``warm_local`` runs at start-up through the service's own cache-and-engine path;
  readiness waits for it.
* ``warmup_remote`` warms a running service or a cluster behind a load balancer over
  HTTP (``chunlian warmup --url URL [--file F]``), in batches of up to 256 items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from chunlian.api.auth import API_KEY_HEADER
from chunlian.api.service import CoupletService
from chunlian.errors import ChunlianError, InvalidInput
from chunlian.retry import MAX_RETRIES, RETRY_ITEM_CODES, RETRY_STATUSES, retry_after_s
from chunlian.text import han_count, normalize
from chunlian.types import CoupletRequest
from chunlian.validation import MAX_BATCH_ITEMS, ComposeIn, CoupletIn

log = logging.getLogger("chunlian.warmup")

KEYWORD_MAX = 4
KEYWORD_LENGTHS = (7, 5)
WARMUP_STYLE = "traditional"
NAME_PREFIX = "name:"  # an entry that is a name (藏头), not a keyword
NAME_LENGTH = 7  # the page's default line length
PAGE_CANDIDATES = 4  # the campaign page's n (``api/web/app.js``: CANDIDATES)
# a warm-up item waits its turn rather than fail at a visitor's deadline: 500 names in the
# best mode queue for the search rows far longer than the default 10 s (``warmup_remote``'s
# client waits 120 s for a batch)
WARMUP_TIMEOUT_MS = 60_000


def warmup_bodies(entries: Iterable[str]) -> list[dict[str, Any]]:
    """The API request bodies for ``entries`` (keywords composed at both lengths; names and
    上联 in the best mode, so the hottest ones are best-quality cache hits for every request
    of the page's ``n``)."""
    bodies: list[dict[str, Any]] = []
    page = {"style": WARMUP_STYLE, "n": PAGE_CANDIDATES, "timeout_ms": WARMUP_TIMEOUT_MS}
    for raw in entries:
        text = normalize(raw)
        if raw.strip().startswith(NAME_PREFIX):
            name = normalize(raw.strip()[len(NAME_PREFIX):])
            bodies.append({"heads": name, "length": NAME_LENGTH, **page, "quality": "best"})
        elif not text:
            continue
        elif len(text) <= KEYWORD_MAX and han_count(text) == len(text):
            bodies.extend({"keyword": text, "length": n, **page} for n in KEYWORD_LENGTHS if len(text) < n)
        else:
            bodies.append({"upper": text, **page, "quality": "best"})
    return bodies


def warmup_requests(entries: Iterable[str]) -> list[CoupletRequest]:
    """Engine requests for ``entries``; invalid entries are logged and skipped."""
    out: list[CoupletRequest] = []
    for body in warmup_bodies(entries):
        try:
            model = CoupletIn.model_validate(body) if "upper" in body else ComposeIn.model_validate(body)
            out.append(model.to_request())
        except (InvalidInput, ValueError) as e:
            log.warning("skipping warm-up entry %r: %s", body.get("upper") or body.get("keyword") or body.get("heads"), e)
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
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    batches_in_flight: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
) -> WarmupReport:
    """Warm the service at ``url`` (its base URL) with ``items`` via ``/v1/couplets/batch``
    (which needs ``api_key`` when the service has keys configured).

    A refused batch (429 from a full queue or a per-client rate, 503 from an instance not
    ready yet) is sent again after its ``Retry-After``, and items refused for load
    (``chunlian.retry.RETRY_ITEM_CODES``) go again in the next try, both at most
    ``MAX_RETRIES`` times: a cluster warmed while it starts, or behind nginx's rate, ends warm
    instead of with a report of refusals.

    ``batches_in_flight`` batches are sent at once (behind a load balancer, to that many
    instances; the results land in their shared cache); ``on_progress(done, total)`` is called
    with the requests settled so far after each batch."""
    if batches_in_flight < 1:
        raise ValueError(f"batches_in_flight must be at least 1, got {batches_in_flight}")
    bodies = warmup_bodies(items)
    report = WarmupReport(requested=len(bodies))
    endpoint = url.rstrip("/") + "/v1/couplets/batch"
    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout_s)
    headers = {API_KEY_HEADER: api_key} if api_key else {}
    gate = asyncio.Semaphore(batches_in_flight)
    done = 0

    async def one(chunk: list[dict[str, Any]]) -> None:
        nonlocal done
        async with gate:
            await _warm_chunk(http, endpoint, headers, chunk, report, sleep)
        done += len(chunk)
        if on_progress is not None:
            on_progress(done, len(bodies))

    try:
        await asyncio.gather(*(one(bodies[i : i + MAX_BATCH_ITEMS]) for i in range(0, len(bodies), MAX_BATCH_ITEMS)))
    finally:
        if own:
            await http.aclose()
    return report


async def _warm_chunk(http: httpx.AsyncClient, endpoint: str, headers: dict[str, str],
                      chunk: list[dict[str, Any]], report: WarmupReport,
                      sleep: Callable[[float], Awaitable[None]]) -> None:
    """One batch of at most ``MAX_BATCH_ITEMS``, with its retries; counts into ``report``."""
    pending = chunk
    for attempt in range(MAX_RETRIES + 1):
        last = attempt == MAX_RETRIES
        try:
            resp = await http.post(endpoint, json={"items": pending}, headers=headers)
        except httpx.HTTPError as e:
            report.failed += len(pending)
            report.errors.append(f"{type(e).__name__}: {e}")
            return
        if resp.status_code in RETRY_STATUSES and not last:
            wait = retry_after_s(resp.headers.get("retry-after"), attempt)
            log.warning("warm-up batch refused (HTTP %d); trying again in %g s", resp.status_code, wait)
            await sleep(wait)
            continue
        if resp.status_code != 200:
            report.failed += len(pending)
            report.errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
            return
        try:
            results = resp.json()["results"]
        except (ValueError, KeyError, TypeError):  # not the service (a proxy's page, say)
            results = None
        if not isinstance(results, list) or len(results) != len(pending):
            report.failed += len(pending)
            report.errors.append(f"HTTP 200 without a result per item: {resp.text[:200]}")
            return
        again: list[dict[str, Any]] = []
        for body, res in zip(pending, results, strict=True):
            err = res.get("error")
            if err is None:
                report.ok += 1
                report.cached += bool(res.get("cached"))
            elif err.get("code") in RETRY_ITEM_CODES and not last:
                again.append(body)
            else:
                report.failed += 1
                report.errors.append(f"{err.get('code')}: {err.get('message')}")
        if not again:
            return
        wait = retry_after_s(None, attempt)
        log.warning("%d warm-up items refused for load; trying them again in %g s", len(again), wait)
        await sleep(wait)
        pending = again
