"""The HTTP API's bodies and answers (pydantic).

The generation request shapes (``CoupletIn``, ``ComposeIn``) and their checks live in
``chunlian.validation``, below the API and the jobs, which both validate with them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chunlian.types import Served
from chunlian.validation import MAX_BATCH_ITEMS


class BatchIn(BaseModel):
    """Up to 256 requests answered together; each item is validated on its own."""

    model_config = ConfigDict(strict=True, extra="ignore")

    items: list[Any] = Field(
        ..., min_length=1, max_length=MAX_BATCH_ITEMS,
        description="Each item is a /v1/couplets body (with upper) or a /v1/couplets/compose body "
        "(with heads or keyword). A bad item gets an error result; the others are answered.",
        json_schema_extra={"items": {"anyOf": [
            {"$ref": "#/components/schemas/CoupletIn"}, {"$ref": "#/components/schemas/ComposeIn"},
        ]}},
    )


class CoupletText(BaseModel):
    """One couplet: 上联, 下联, 横批 and style."""

    upper: str
    lower: str
    hengpi: str
    style: str


class CoupletOut(CoupletText):
    """A generated couplet; ``candidates`` (best first) only when n > 1."""

    cached: bool
    model: str = Field(..., description="name@version of the model that wrote it")
    served: Served = Field(..., description="The mode that wrote it: best (the quality mode's search), good (a narrower search) or fast (greedy decoding, or sampling with a seed).")
    candidates: list[CoupletText] | None = None


class ErrorDetail(BaseModel):
    """What went wrong; ``field`` names the offending input field when there is one."""

    code: str
    message: str
    field: str | None = None


class ErrorOut(BaseModel):
    """Every error response has this shape."""

    error: ErrorDetail


class BatchOut(BaseModel):
    """One result per item, in order: a couplet or an error."""

    results: list[CoupletOut | ErrorOut]


class HealthOut(BaseModel):
    """Liveness and readiness answers."""

    status: str
    instance: str
    model: str | None = None
