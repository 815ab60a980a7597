"""Scenario 7: security basics (package docstring).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from tests.reliability.harness.bad_input import Case, send_case
from tests.reliability.harness.common import (
    HAN_RE,
    HOST,
    JSON_HEADERS,
    REDIS_PORT,
    Outcome,
    Reply,
    error_shape_problem,
    json_body,
)
from tests.reliability.harness.services import ServiceProcess

# ---- 7. security basics ------------------------------------------------------------------------------

SECURITY_LINES = ("瑞雪兆丰年喜气盈门", "金鸡报晓千家乐", "玉兔迎春万户欢", "龙腾四海庆有余")


async def security(svc: ServiceProcess, *, api_keys: Sequence[str], redis_db: int | None,
                   body_limit: int = 1_000_000) -> Outcome:
    """Size limits, hashed cache keys, API keys on the bulk endpoints (jobs, batch), no internals in
    errors, request ids (and never keys) in the logs. ``svc`` must log at INFO."""
    out = Outcome("7. security basics", "limits, cache keys, API keys, error bodies, logs")
    t0 = time.monotonic()
    url, port = svc.url, svc.port
    key = api_keys[0] if api_keys else None
    rid = f"rel-sec-{uuid.uuid4().hex[:12]}"
    wrong_key = f"wrong-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        def expect(r: httpx.Response, status: int, code: str | None, what: str, sent: str = "") -> None:
            reply = Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)
            ok = r.status_code == status
            why = error_shape_problem(reply, sent) if status >= 400 else None
            if ok and code is not None and why is None and reply.json()["error"]["code"] != code:
                why = f"code {reply.json()['error']['code']!r}, expected {code!r}"
            if not r.headers.get("x-request-id"):
                why = (why or "") + " no X-Request-Id"
            if ok and not why:
                out.count("rejected" if status >= 400 else "answered", str(r.status_code))
            else:
                out.count("failed", str(r.status_code))
                out.problem(f"{what}: expected {status} {code or ''}, got {r.status_code} {r.text[:200]} {why or ''}")

        # body and header limits
        over = json_body({"upper": "春" * (body_limit // 3 + 10)})
        expect(await c.post("/v1/couplets", content=over, headers=JSON_HEADERS), 413, "body_too_large", "body over the limit")

        async def chunks() -> Any:
            for _ in range(body_limit // 8192 + 2):
                yield b" " * 8192

        expect(await c.post("/v1/couplets", content=chunks(), headers=JSON_HEADERS), 413, "body_too_large",
               "chunked body over the limit")
        expect(await c.get("/healthz", headers={"X-Big": "b" * 20_000}), 431, "headers_too_large", "one 20 KB header")
        expect(await c.get("/healthz", headers=[(f"X-H{i}", "v" * 60) for i in range(400)]), 431, "headers_too_large",
               "400 headers")
        huge = await send_case(port, Case("100 KB header", method="GET", path="/healthz",
                                          headers=[("X-Huge", "h" * 100_000)], body=None))
        if huge.status not in (400, 431) or error_shape_problem(huge, allow_protocol_400=True):
            out.count("failed", str(huge.status))
            out.problem(f"100 KB header: {huge.status} {huge.text[:200]}")
        else:
            out.count("rejected", str(huge.status))

        # cache keys are hashes: no user text in Redis key names
        sent_texts: list[str] = []
        for line in SECURITY_LINES:
            r = await c.post("/v1/couplets", json={"upper": line}, headers={"X-Request-Id": rid})
            expect(r, 200, None, f"couplet {line}")
            sent_texts.append(line)
        r = await c.post("/v1/couplets/compose", json={"keyword": "瑞雪", "length": 7})
        expect(r, 200, None, "compose keyword")
        sent_texts.append("瑞雪")
        if redis_db is not None:
            import redis

            rds = redis.Redis(host=HOST, port=REDIS_PORT, db=redis_db, socket_timeout=5)
            names = [k.decode("utf-8", "replace") for k in rds.scan_iter(count=1000)]
            rds.close()
            cache_keys = [k for k in names if k.startswith("chunlian:v1:")]
            if len(cache_keys) < len(SECURITY_LINES):
                out.problem(f"only {len(cache_keys)} cache keys in Redis db {redis_db}; the answers were not cached there")
            for k in names:
                if HAN_RE.search(k) or any(t in k for t in sent_texts) or (
                        k.startswith("chunlian:v1:") and not re.fullmatch(r"chunlian:v1:[0-9a-f]{64}", k)):
                    out.problem(f"a Redis key name carries user text or is not a hash: {k[:120]!r}")
            out.note(f"{len(names)} Redis key names in db {redis_db} checked: hashes only")

        # API keys on the job endpoints (when the build has them)
        spec = (await c.get("/openapi.json")).json()
        if "/v1/jobs" in spec.get("paths", {}) and key:
            out.extra["jobs_checked"] = True
            job = {"items": [{"upper": SECURITY_LINES[0]}]}
            expect(await c.post("/v1/jobs", json=job), 401, "unauthorized", "job without a key")
            expect(await c.post("/v1/jobs", json=job, headers={"X-API-Key": wrong_key}), 401, "unauthorized",
                   "job with a wrong key")
            expect(await c.get("/v1/jobs/abc", headers={"X-API-Key": wrong_key}), 401, "unauthorized",
                   "job status with a wrong key")
            r = await c.post("/v1/jobs", json=job, headers={"X-API-Key": key, "X-Request-Id": rid})
            expect(r, 202, None, "job with the key")
            if r.status_code == 202:
                g = await c.get(f"/v1/jobs/{r.json()['job_id']}", headers={"X-API-Key": api_keys[-1]})
                expect(g, 200, None, "job status with another configured key")
            expect(await c.post("/v1/couplets", json={"upper": SECURITY_LINES[1]}), 200, None,
                   "couplets need no key")
            batch = {"items": [{"upper": SECURITY_LINES[2]}]}  # bulk work: a key, as for jobs
            expect(await c.post("/v1/couplets/batch", json=batch), 401, "unauthorized", "batch without a key")
            expect(await c.post("/v1/couplets/batch", json=batch, headers={"X-API-Key": key}), 200, None,
                   "batch with the key")
        elif not key:
            out.note("no API keys configured: job endpoints open")
        else:
            out.note("this build has no /v1/jobs: API key check skipped")

        # error bodies never carry internals (a sample of every error path)
        for path, body in (("/v1/couplets", b"{"), ("/v1/couplets", b'{"upper":"\xff"}'), ("/v1/nothing", b"{}"),
                           ("/v1/couplets/compose", b'{"heads":1}')):
            r = await c.post(path, content=body, headers=JSON_HEADERS)
            reply = Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)
            why = error_shape_problem(reply, body)
            if r.status_code < 400 or why:
                out.count("failed", str(r.status_code))
                out.problem(f"error body for {path} {body!r}: {r.status_code} {why}")
            else:
                out.count("rejected", str(r.status_code))

    # logs: the request id is there, the keys never are
    await asyncio.sleep(0.5)
    log = svc.log_text()
    if f"rid={rid}" not in log:
        out.problem(f"the access log has no line with rid={rid}")
    for secret in [*api_keys, wrong_key]:
        if secret and secret in log:
            out.problem("an API key appears in the service log")
    if "Traceback" in log:
        out.note("the service log holds a traceback (logged on purpose for an unexpected error)")
    out.seconds = time.monotonic() - t0
    return out
