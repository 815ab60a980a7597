"""The HTTP API's request and response shapes (pydantic), and their engine requests.

Shapes and ranges are checked by pydantic (strict types: ``"3"`` is not a number); the
text rules (Chinese only, at most 32 characters, clause punctuation) by ``chunlian.text``
in ``to_request``, which raises ``InvalidInput`` naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chunlian.errors import InvalidInput
from chunlian.text import validate_heads, validate_keyword, validate_upper
from chunlian.types import CoupletRequest, DecodeParams, Priority

StyleName = Literal["traditional", "business", "family", "literary"]

MAX_BATCH_ITEMS = 256
MAX_CANDIDATES = 8
MAX_RAW_TEXT = 1024  # characters before normalisation; the line rules apply after it
MAX_SEED = 2**63 - 1


class _Decoding(BaseModel):
    """Options shared by every generation request."""

    model_config = ConfigDict(strict=True, extra="ignore")

    style: StyleName = Field("traditional", description="传统, 商贸, 家庭 or 文雅 register.")
    n: int = Field(1, ge=1, le=MAX_CANDIDATES, description="Candidates to generate (sampled when > 1).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Sample with this seed (null: greedy).")
    regenerate: bool = Field(False, description="Sample afresh with a new seed, bypassing the cache.")
    timeout_ms: int | None = Field(
        None, ge=10, le=600_000, description="Deadline including queue time (null: server default)."
    )

    def _params(self) -> DecodeParams:
        return DecodeParams(n=self.n, seed=self.seed)

    def _timeout_s(self) -> float | None:
        return None if self.timeout_ms is None else self.timeout_ms / 1000.0


class CoupletIn(_Decoding):
    """Write the 下联 (and 横批) for a given 上联."""

    upper: str = Field(
        ..., max_length=MAX_RAW_TEXT, description="The 上联: Chinese (simplified or traditional: the answer comes in the same script), at most 32 characters.",
        examples=["春回大地千山秀"],
    )

    def to_request(self, priority: Priority = "interactive") -> CoupletRequest:
        """The engine request; raises ``InvalidInput`` when the text breaks the line rules."""
        return CoupletRequest(
            style=self.style, upper=validate_upper(self.upper, "upper"), params=self._params(),
            priority=priority, timeout_s=self._timeout_s(),
        )


class ComposeIn(_Decoding):
    """Write a whole couplet from a name (藏头: ``heads``) or a ``keyword`` the 上联 opens with."""

    heads: str | None = Field(
        None, max_length=MAX_RAW_TEXT, description="1-2 Chinese characters heading the two lines (a traditional name gets a traditional couplet).",
        examples=["李明"],
    )
    keyword: str | None = Field(
        None, max_length=MAX_RAW_TEXT, description="1-4 Chinese characters opening the 上联.",
        examples=["新春"],
    )
    length: Literal[5, 7] = Field(7, description="Characters per line.")

    def to_request(self, priority: Priority = "interactive") -> CoupletRequest:
        """The engine request; raises ``InvalidInput`` naming the offending field."""
        length = int(self.length)
        if self.heads is not None and self.keyword is not None:
            raise InvalidInput("give either heads or keyword, not both", "keyword")
        if self.heads is not None:
            heads = validate_heads(self.heads)
            return CoupletRequest(
                style=self.style, heads=heads, length=length, params=self._params(),
                priority=priority, timeout_s=self._timeout_s(),
            )
        if self.keyword is not None:
            keyword = validate_keyword(self.keyword, length)
            return CoupletRequest(
                style=self.style, keyword=keyword, length=length, params=self._params(),
                priority=priority, timeout_s=self._timeout_s(),
            )
        raise InvalidInput("either heads or keyword is required", "heads")


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


def parse_item(item: object) -> CoupletIn | ComposeIn:
    """Validate one batch item; raises pydantic's ``ValidationError`` or ``InvalidInput``."""
    if not isinstance(item, dict):
        raise InvalidInput("each item must be a JSON object", "items")
    if "upper" not in item and ("heads" in item or "keyword" in item):
        return ComposeIn.model_validate(item)
    return CoupletIn.model_validate(item)


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
