"""HTTP routes: couplets, compose, batch, health, readiness, metrics and the campaign page.

Handlers stay thin: validate (``schemas``), answer (``service``), shape the JSON. A cache
hit never touches the engine. While a request waits for the engine, the handler also
watches for the client going away and cancels the generation if it does, so a closed tab
frees its batch slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.responses import FileResponse, Response
from starlette.types import Receive

from chunlian.api.auth import KEY_NEEDED, require_api_key
from chunlian.api.errors import (
    ClientGone,
    describe,
    error_body,
    error_response,
    json_bytes,
    retry_after_header,
)
from chunlian.api.runtime import Runtime
from chunlian.api.schemas import BatchIn, BatchOut, CoupletOut, ErrorOut, HealthOut
from chunlian.api.service import Answer, CoupletService
from chunlian.errors import Cancelled, ChunlianError, NotReady
from chunlian.types import Couplet, CoupletRequest
from chunlian.validation import ComposeIn, CoupletIn, parse_item, validation_detail

WEB_DIR = Path(__file__).resolve().parent / "web"

T = TypeVar("T")

_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorOut, "description": "Invalid input (field named in the error)."},
    429: {"model": ErrorOut, "description": "Queue full; retry after the Retry-After seconds."},
    503: {"model": ErrorOut, "description": "Not ready yet, or shutting down."},
    504: {"model": ErrorOut, "description": "The request's deadline passed."},
}

router = APIRouter()


def json_response(content: Any, status: int = 200) -> Response:
    """A JSON response without a second validation pass."""
    return Response(json_bytes(content), status_code=status, media_type="application/json")


def _runtime(request: Request) -> Runtime:
    rt = request.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt


def _service(request: Request) -> CoupletService:
    rt = _runtime(request)
    if not rt.serving or rt.service is None:
        raise NotReady("the service is loading the model or warming up; retry shortly")
    return rt.service


def _couplet_dict(c: Couplet) -> dict[str, str]:
    return {"upper": c.upper, "lower": c.lower, "hengpi": c.hengpi, "style": c.style}


def couplet_json(answer: Answer, model_tag: str, n: int) -> dict[str, Any]:
    """The response body of one answered request."""
    r = answer.result
    out: dict[str, Any] = _couplet_dict(r.best)
    out["cached"] = answer.cached
    out["model"] = r.model or model_tag
    out["served"] = r.served
    if n > 1:
        out["candidates"] = [_couplet_dict(c) for c in (r.candidates or (r.best,))]
    return out


async def _client_gone(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def generate_for_client(
    receive: Receive, svc: CoupletService, req: CoupletRequest, *, regenerate: bool = False,
    arrival_s: float | None = None,
) -> Answer:
    """``svc.generate`` while watching the client's connection (``receive``): if it closes
    first, the generation is cancelled and ``ClientGone`` raised."""
    watch = asyncio.ensure_future(_client_gone(receive))
    try:
        return await svc.generate(req, regenerate=regenerate, arrival_s=arrival_s, gone=watch)
    except Cancelled:
        if watch.done() and not watch.cancelled():
            raise ClientGone("the client closed the connection") from None
        raise
    finally:
        watch.cancel()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (and raising ``ClientGone``) if the client leaves."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_client_gone(request.receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, ChunlianError):
        await task
    raise ClientGone("the client closed the connection")


async def couplet_reply(
    receive: Receive, svc: CoupletService, body: CoupletIn | ComposeIn, arrival_s: float | None,
) -> bytes:
    """The response body for a couplet request whose shape is valid: the text rules
    (``to_request``), then the cached answer unless ``regenerate``, else a new one while
    watching the client's connection (``receive``: ``generate_for_client``).

    One function for the routes and the fast path (``api.fastpath``) alike, so both answer
    the same request the same way. Errors are raised (``ChunlianError``: bad text, overload,
    deadline, ...); both answer them with ``errors.chunlian_error_logged``."""
    req = body.to_request()
    answer = await svc.cached(req) if not body.regenerate else None
    if answer is None:
        answer = await generate_for_client(receive, svc, req, regenerate=body.regenerate,
                                           arrival_s=arrival_s)
    # a regenerated answer is a fresh sample, not an ask of the line's answer
    return json_bytes(couplet_json(svc.count(answer, None if body.regenerate else req), svc.model_tag, body.n))


async def _couplet_route(body: CoupletIn | ComposeIn, request: Request) -> Response:
    svc = _service(request)
    reply = await couplet_reply(request.receive, svc, body, getattr(request.state, "arrival_s", None))
    return Response(reply, media_type="application/json")


@router.post("/v1/couplets", response_model=CoupletOut, responses=_ERRORS, tags=["couplets"])
async def create_couplet(body: CoupletIn, request: Request) -> Response:
    """Write the 下联 and 横批 for a 上联 (cached unless ``regenerate``)."""
    return await _couplet_route(body, request)


@router.post("/v1/couplets/compose", response_model=CoupletOut, responses=_ERRORS, tags=["couplets"])
async def compose_couplet(body: ComposeIn, request: Request) -> Response:
    """Write a whole couplet headed by a name (``heads``) or opening with a ``keyword``."""
    return await _couplet_route(body, request)


async def _batch_item(svc: CoupletService, item: object) -> dict[str, Any]:
    try:
        parsed = parse_item(item)
        req = parsed.to_request(priority="bulk")
        answer = await svc.answer(req, regenerate=parsed.regenerate)
    except ValidationError as e:
        code, message, field = validation_detail(list(e.errors()))
        return error_body(code, message, field)
    except ChunlianError as e:
        return error_body(*describe(e))
    return couplet_json(svc.count(answer, None if parsed.regenerate else req), svc.model_tag, parsed.n)


@router.post("/v1/couplets/batch", response_model=BatchOut, tags=["couplets"],
             responses={**_ERRORS, 401: {"model": ErrorOut, "description": KEY_NEEDED}},
             dependencies=[Depends(require_api_key)])
async def batch_couplets(body: BatchIn, request: Request) -> Response:
    """Answer up to 256 requests at once; a bad item gets an error, the rest are answered.
    Needs ``X-API-Key`` when ``CHUNLIAN_API_KEYS`` is set (bulk work: ``api.auth``)."""
    svc = _service(request)
    work = asyncio.gather(*(_batch_item(svc, item) for item in body.items))
    results = await unless_disconnected(request, work)
    return json_response({"results": results})


@router.get("/healthz", response_model=HealthOut, tags=["operations"])
async def healthz(request: Request) -> Response:
    """Liveness: 200 while the process serves HTTP."""
    rt = _runtime(request)
    return json_response({"status": "ok", "instance": rt.settings.instance_id, "model": rt.model_tag})


@router.get("/readyz", response_model=HealthOut, responses={503: {"model": ErrorOut}}, tags=["operations"])
async def readyz(request: Request) -> Response:
    """Readiness: 200 once the model is loaded and warm-up is done; 503 before, and from
    the moment the instance starts draining (SIGTERM)."""
    rt = _runtime(request)
    if rt.drain.draining:
        return error_response(503, "shutting_down", "this instance is shutting down",
                              headers=retry_after_header(1.0))
    if rt.serving:
        return json_response({"status": "ready", "instance": rt.settings.instance_id, "model": rt.model_tag})
    if rt.failed:
        message = "start-up failed; see the service log"
    elif rt.ready:
        message = "the engine has stopped"
    else:
        message = "loading the model and warming up"
    return error_response(503, "not_ready", message, headers=retry_after_header(1.0))


@router.get("/metrics", tags=["operations"], response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus metrics in the text exposition format."""
    body = await asyncio.to_thread(_runtime(request).metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def index() -> Response:
    """The campaign page."""
    page = WEB_DIR / "index.html"
    if not page.is_file():
        return error_response(404, "not_found", "Not Found")
    return FileResponse(page, media_type="text/html; charset=utf-8")
