"""Bulk jobs over HTTP: submit, poll (paged results), cancel.

* ``POST /v1/jobs`` ``{"items": [...]}`` (1 to 10,000 ``/v1/couplets`` or
  ``/v1/couplets/compose`` bodies) → ``202 {"job_id", "status", "total"}``; every item is
  validated first, the first bad one makes it a 422 naming it (``items.7.upper``).
  ``"quality"`` is ``best`` by default (``true`` and ``auto`` say the same): the items the
  quality mode can answer (上联 and composed items with n = 1 and no seed) are searched (``jobs.quality``),
  the others written fast; ``fast`` (or ``false``) writes every item fast.
* ``GET /v1/jobs/{id}?offset=0&limit=100`` → status, progress and one page of results
  (an entry per item index: done with its couplet, failed with its error, cancelled, or
  pending).
* ``DELETE /v1/jobs/{id}`` → cancels every item that has not run; the job's state.
* ``GET /v1/jobs?limit=20`` → the newest jobs still held, newest first (states, no results).

When ``CHUNLIAN_API_KEYS`` is set, every job endpoint needs one of them in ``X-API-Key``
(401 otherwise; ``api.auth``). Errors have the service's one shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.responses import Response

from chunlian.api.auth import KEY_NEEDED, require_api_key
from chunlian.api.errors import json_bytes
from chunlian.api.schemas import ErrorOut
from chunlian.errors import InvalidInput
from chunlian.jobs.backend import JobsBackend
from chunlian.jobs.items import MAX_JOB_ITEMS, validate_items
from chunlian.jobs.store import MAX_RESULTS_PAGE, JobState
from chunlian.types import Quality

DEFAULT_PAGE = 100
DEFAULT_LIST, MAX_LIST = 20, 100


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": KEY_NEEDED},
    422: {"model": ErrorOut, "description": "Invalid body or query (field named in the error)."},
    503: {"model": ErrorOut, "description": "Not ready, or the job queue is unavailable."},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "No such job (or it expired)."}}

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_api_key)])


class JobIn(BaseModel):
    """A bulk job: up to 10,000 items, each validated like a single request."""

    model_config = ConfigDict(strict=True, extra="ignore")

    items: list[Any] = Field(
        ..., min_length=1, max_length=MAX_JOB_ITEMS,
        description="Each item is a /v1/couplets body (with upper) or a /v1/couplets/compose "
        "body (with heads or keyword). Every item is checked on submission.",
        json_schema_extra={"items": {"anyOf": [
            {"$ref": "#/components/schemas/CoupletIn"}, {"$ref": "#/components/schemas/ComposeIn"},
        ]}},
    )
    quality: Quality = Field(
        "best", description="best (the default; `true` too): every item with n = 1 and no seed (a 上联, "
        "or a composed couplet in two stages) is answered by the quality mode's search, at bulk priority; the others are written fast. "
        "fast (`false`): greedy decoding for every item. auto: as best (bulk work is paced by the bulk "
        "share, not by a deadline). Each result says which mode `served` it.",
        json_schema_extra={"anyOf": [{"enum": ["auto", "best", "fast"], "type": "string"}, {"type": "boolean"}]},
    )

    @field_validator("quality", mode="before")
    @classmethod
    def _quality_from_bool(cls, v: object) -> object:
        """``true`` / ``false`` (the field's first form) are ``best`` / ``fast``."""
        return {True: "best", False: "fast"}.get(v, v) if isinstance(v, bool) else v


class JobAccepted(BaseModel):
    job_id: str
    status: str
    total: int


class JobProgress(BaseModel):
    done: int
    failed: int
    cancelled: int
    total: int


class JobOut(BaseModel):
    """A job's state and one page of its results (one entry per item index)."""

    job_id: str
    status: str = Field(..., description="queued | running | done | failed | cancelled")
    progress: JobProgress
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    offset: int | None = None
    limit: int | None = None
    results: list[dict[str, Any]] | None = Field(
        None, description='{"index", "status": "done", "upper", "lower", "hengpi", "style", "model"} | '
        '{"index", "status": "failed", "error": {...}} | {"index", "status": "cancelled" | "pending"}',
    )


class JobList(BaseModel):
    """The newest jobs this service still holds (created within the results' TTL)."""

    jobs: list[JobOut]


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json_bytes(content), status_code=status, media_type="application/json", headers=headers)


def _jobs(request: Request) -> JobsBackend:
    jobs = request.app.state.jobs
    return jobs  # type: ignore[no-any-return]


def _not_found(job_id: str) -> Response:
    from chunlian.api.errors import error_response

    return error_response(404, "not_found", f"no job {job_id!r} (it may have expired)", "job_id")


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer, got {raw!r}", name) from None
    if not lo <= value <= hi:
        raise InvalidInput(f"{name} must be between {lo} and {hi}, got {value}", name)
    return value


@router.post("/v1/jobs", status_code=202, response_model=JobAccepted, responses=_ERRORS)
async def submit_job(body: JobIn, request: Request) -> Response:
    """Queue a bulk job; poll ``GET /v1/jobs/{job_id}`` for progress and results."""
    specs = validate_items(body.items, body.quality != "fast")
    job_id = await _jobs(request).submit(specs)
    return _json({"job_id": job_id, "status": "queued", "total": len(specs)}, 202,
                 {"Location": f"/v1/jobs/{job_id}"})


@router.get("/v1/jobs", response_model=JobList, responses=_ERRORS)
async def list_jobs(request: Request) -> Response:
    """The newest ``limit`` jobs (default 20, at most 100), newest first: states and progress,
    no results (``GET /v1/jobs/{job_id}`` pages those)."""
    limit = _int_param(request, "limit", DEFAULT_LIST, 1, MAX_LIST)
    states = await _jobs(request).recent(limit)
    return _json({"jobs": [s.as_dict() for s in states]})


@router.get("/v1/jobs/{job_id}", response_model=JobOut, responses={**_ERRORS, **_NOT_FOUND})
async def get_job(job_id: str, request: Request) -> Response:
    """Status, progress, and results ``offset .. offset+limit-1`` (limit at most 1000)."""
    offset = _int_param(request, "offset", 0, 0, MAX_JOB_ITEMS)
    limit = _int_param(request, "limit", DEFAULT_PAGE, 0, MAX_RESULTS_PAGE)
    jobs = _jobs(request)
    state = await jobs.state(job_id)
    if state is None:
        return _not_found(job_id)
    body = state.as_dict()
    body.update(offset=offset, limit=limit, results=await jobs.results(job_id, offset, limit))
    return _json(body)


@router.delete("/v1/jobs/{job_id}", response_model=JobOut, responses={**_ERRORS, **_NOT_FOUND})
async def cancel_job(job_id: str, request: Request) -> Response:
    """Cancel every item that has not run (a finished job stays as it is)."""
    state: JobState | None = await _jobs(request).cancel(job_id)
    if state is None:
        return _not_found(job_id)
    return _json(state.as_dict())
