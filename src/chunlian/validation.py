"""Request validation shared by the HTTP API and the jobs: the generation request shapes
(pydantic) and the text checks behind them.

Shapes and ranges are checked by pydantic (strict types: ``"3"`` is not a number); the
text rules (Chinese only, at most 32 characters, clause punctuation) by ``chunlian.text``
and the checks here in ``to_request``, which raises ``InvalidInput`` naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chunlian.data.blocklist import default_blocklist, input_blocklist
from chunlian.errors import InvalidInput
from chunlian.names import line_heads
from chunlian.script import simplified
from chunlian.text import is_han, normalize, validate_upper
from chunlian.types import CoupletRequest, DecodeParams, Priority, Quality

StyleName = Literal["traditional", "business", "family", "literary"]

MAX_BATCH_ITEMS = 256
MAX_CANDIDATES = 8  # a request's n: sampled candidates
MIN_TIMEOUT_MS = 10  # a request's timeout_ms, and the service's default for it
MAX_TIMEOUT_MS = 600_000
MAX_RAW_TEXT = 1024  # characters before normalisation; the line rules apply after it
MAX_SEED = 2**63 - 1
MAX_NAME_CHARS = 4  # a full name, compound surname included (``names.line_heads``)


def _han_only(raw: object, field: str, most: int) -> str:
    if not isinstance(raw, str):
        raise InvalidInput(f"{field} must be a string", field)
    text = normalize(raw)
    if not text:
        raise InvalidInput(f"{field} is empty", field)
    if len(text) > most:
        raise InvalidInput(f"{field} is too long: {len(text)} characters, at most {most}", field)
    if not all(is_han(ch) for ch in text):
        raise InvalidInput(f"{field} must be Chinese characters only", field)
    check_words(text, field)
    return text


def check_words(text: str, field: str) -> None:
    """A user's own words are answered unless they are vulgar or insulting; a keyword is
    also written into the 上联 as it is, so it may hold no term generation never writes.
    The list holds simplified and traditional forms; mixed scripts are checked simplified."""
    bans = (input_blocklist(),) if field != "keyword" else (input_blocklist(), default_blocklist())
    for bl in bans:
        if bl.find(text) or bl.find(simplified(text)):
            what = "a vulgar or insulting term" if bl is bans[0] else "a term we never write"
            raise InvalidInput(f"{field} contains {what}", field)


def validate_user_upper(raw: object) -> str:
    """A user's 上联: the line rules (``text.validate_upper``), then the input word check."""
    upper = validate_upper(raw, "upper")
    check_words(upper, "upper")
    return upper


def validate_heads(raw: object) -> str:
    """A name of 1-4 characters for a 藏头 couplet, as the characters that head its two lines
    (``names.line_heads``: a full name's given name; 丹丹 heads both lines with 丹). The
    whole name is checked for vulgar or insulting terms (``check_words``), as typed and
    simplified."""
    name = _han_only(raw, "heads", MAX_NAME_CHARS)
    return line_heads(name)


def validate_keyword(raw: object, length: int) -> str:
    """A theme keyword of 1-4 characters that the 上联 opens with, shorter than the line."""
    keyword = _han_only(raw, "keyword", 4)
    if len(keyword) >= length:
        raise InvalidInput(
            f"keyword must be shorter than the line length {length}, got {len(keyword)} characters",
            "keyword",
        )
    return keyword


class _Decoding(BaseModel):
    """Options shared by every generation request."""

    model_config = ConfigDict(strict=True, extra="ignore")

    style: StyleName = Field("traditional", description="传统, 商贸, 家庭 or 文雅 register.")
    n: int = Field(1, ge=1, le=MAX_CANDIDATES, description="Candidates to generate (sampled when > 1).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Sample with this seed (null: greedy).")
    regenerate: bool = Field(False, description="Sample afresh with a new seed, bypassing the cache.")
    timeout_ms: int | None = Field(
        None, ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS,
        description="Deadline including queue time (null: server default).",
    )
    quality: Quality = Field(
        "auto", description="best: the quality mode's search, at whatever latency the load allows (429 when "
        "its deadline cannot be met); fast: greedy decoding; auto: best while the service has headroom, "
        "stepping down under load. The answer's `served` says which mode wrote it. A composed couplet in best or "
        "auto: its 上联 searched under its name or keyword, then answered in that mode. A seed or regenerate "
        "is written fast.",
    )

    def _params(self) -> DecodeParams:
        if self.quality == "best" and (self.seed is not None or self.regenerate):
            raise InvalidInput("quality best is a deterministic search: it takes no seed and no regenerate "
                               "(use auto or fast to sample)", "quality")
        return DecodeParams(n=self.n, seed=self.seed)

    def _timeout_s(self) -> float | None:
        return None if self.timeout_ms is None else self.timeout_ms / 1000.0


class CoupletIn(_Decoding):
    """Write the 下联 (and 横批) for a given 上联."""

    upper: str = Field(
        ..., max_length=MAX_RAW_TEXT, description="The 上联: Chinese (simplified or traditional: the answer comes in the same script), at most 32 characters; clauses split by one of ，、；：！？。 —— …… (ASCII , ; : ! ? . -- ... too) and the line closed by at most one of 。！？ ……, which the 下联 mirrors.",
        examples=["春回大地千山秀"],
    )

    def to_request(self, priority: Priority = "interactive") -> CoupletRequest:
        """The engine request; raises ``InvalidInput`` when the text breaks the line rules."""
        return CoupletRequest(
            style=self.style, upper=validate_user_upper(self.upper), params=self._params(),
            priority=priority, timeout_s=self._timeout_s(), quality=self.quality,
        )


class ComposeIn(_Decoding):
    """Write a whole couplet from a name (藏头: ``heads``) or a ``keyword`` the 上联 opens with."""

    heads: str | None = Field(
        None, max_length=MAX_RAW_TEXT, description="A name of 1-4 Chinese characters, heading the two lines: a 2-character name heads them in order (王伟: 王… / 伟…); of a 3- or 4-character full name, the given name heads them and the surname is not written (王秀英: 秀… / 英…); a repeated character heads both (丹丹: 丹… / 丹…). A traditional name gets a traditional couplet.",
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
                priority=priority, timeout_s=self._timeout_s(), quality=self.quality,
            )
        if self.keyword is not None:
            keyword = validate_keyword(self.keyword, length)
            return CoupletRequest(
                style=self.style, keyword=keyword, length=length, params=self._params(),
                priority=priority, timeout_s=self._timeout_s(), quality=self.quality,
            )
        raise InvalidInput("either heads or keyword is required", "heads")


def parse_item(item: object) -> CoupletIn | ComposeIn:
    """Validate one batch item; raises pydantic's ``ValidationError`` or ``InvalidInput``."""
    if not isinstance(item, dict):
        raise InvalidInput("each item must be a JSON object", "items")
    if "upper" not in item and ("heads" in item or "keyword" in item):
        return ComposeIn.model_validate(item)
    return CoupletIn.model_validate(item)


def validation_detail(errors: list[Any]) -> tuple[str, str, str | None]:
    """(code, message, field) for the first of pydantic's / FastAPI's validation errors."""
    if not errors:
        return "invalid_input", "invalid request", None
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ())]
    if loc and loc[0] == "body":
        loc = loc[1:]
    if err.get("type") == "json_invalid":
        reason = (err.get("ctx") or {}).get("error", "")
        return "invalid_json", f"request body is not valid JSON: {reason}".rstrip(": "), None
    if not loc:
        if err.get("type") == "missing":
            return "invalid_input", "a JSON request body is required", None
        return "invalid_input", "request body must be a JSON object", None
    field = ".".join(loc)
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "missing":
        msg = "field required"
    return "invalid_input", f"{field}: {msg}", field
