"""Job items: validation at submission, the compact item spec, and result entries.

An item is a ``/v1/couplets`` body (with ``upper``) or a ``/v1/couplets/compose`` body (with
``heads`` or ``keyword``), validated by the same schemas as those endpoints. Every item of
a job is checked when the job is submitted, so a job that is accepted holds only items the
model can be asked; the first bad item makes the whole job a 422 naming it
(``items.7.upper``).

A validated item travels as a *spec*: a small JSON object with only what determines the
output (``upper`` | ``heads`` + ``length`` | ``keyword`` + ``length``, ``style``, and ``n``
and ``seed`` when not the defaults, ``quality`` in a quality job). It goes into Celery
messages and back into a ``CoupletRequest`` at ``bulk`` priority in the worker.

A result entry is what ``GET /v1/jobs/{id}`` shows for one item (``index`` is added when
read)::

    {"status": "done", "upper", "lower", "hengpi", "style", "model"[, "candidates"]}
    {"status": "failed", "error": {"code", "message", "field"}}
    {"status": "cancelled"}
    {"status": "pending"}          (never stored: an item without a result yet)
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from chunlian.errors import InvalidInput
from chunlian.types import CoupletRequest, CoupletResult, DecodeParams
from chunlian.validation import parse_item, validation_detail

MAX_JOB_ITEMS = 10_000
Spec = dict[str, Any]
Entry = dict[str, Any]

DONE, FAILED, CANCELLED, PENDING = "done", "failed", "cancelled", "pending"
OUTCOMES = (DONE, FAILED, CANCELLED)


def _prefixed(field: str | None, index: int) -> str:
    return f"items.{index}" + (f".{field}" if field and field != "items" else "")


def validate_items(raw: list[Any], quality: bool = True) -> list[Spec]:
    """Specs for every item; raises ``InvalidInput`` naming the first bad one. ``quality``:
    the items the quality mode can answer (``searchable``) are marked for it."""
    if not raw:
        raise InvalidInput("items must hold at least one item", "items")
    if len(raw) > MAX_JOB_ITEMS:
        raise InvalidInput(f"a job holds at most {MAX_JOB_ITEMS} items, got {len(raw)}", "items")
    specs: list[Spec] = []
    for i, item in enumerate(raw):
        try:
            req = parse_item(item).to_request(priority="bulk")
        except ValidationError as e:
            _, message, field = validation_detail(list(e.errors()))
            raise InvalidInput(f"items.{i}: {message}", _prefixed(field, i)) from None
        except InvalidInput as e:
            raise InvalidInput(f"items.{i}: {e.message}", _prefixed(e.field, i)) from None
        spec = spec_of(req)
        if quality and searchable(spec):
            spec["quality"] = True
        specs.append(spec)
    return specs


def searchable(spec: Spec) -> bool:
    """Whether the quality mode can answer an item: a 上联, or a composed couplet (in two
    stages: ``engine.composed``), with ``n`` = 1 and no seed (the others are written fast)."""
    return spec.get("n", 1) == 1 and spec.get("seed") is None


def spec_of(req: CoupletRequest) -> Spec:
    """The compact, JSON-able form of a validated request."""
    spec: Spec = {"style": req.style}
    if req.upper is not None:
        spec["upper"] = req.upper
    elif req.heads is not None:
        spec["heads"], spec["length"] = req.heads, req.length
    else:
        spec["keyword"], spec["length"] = req.keyword, req.length
    if req.params.n != 1:
        spec["n"] = req.params.n
    if req.params.seed is not None:
        spec["seed"] = req.params.seed
    return spec


def request_of(spec: Spec, timeout_s: float | None = None) -> CoupletRequest:
    """The ``bulk``-priority engine request of a spec (already validated at submission)."""
    return CoupletRequest(
        style=str(spec.get("style", "traditional")),
        upper=spec.get("upper"), heads=spec.get("heads"), keyword=spec.get("keyword"),
        length=spec.get("length"),
        params=DecodeParams(n=int(spec.get("n", 1)), seed=spec.get("seed")),
        priority="bulk", timeout_s=timeout_s, quality="best" if spec.get("quality") else "fast",
    )


def spec_text(spec: Spec) -> str:
    """The item's input text (for test hooks and logs)."""
    return str(spec.get("upper") or spec.get("heads") or spec.get("keyword") or "")


def done_entry(result: CoupletResult, n: int = 1) -> Entry:
    b = result.best
    entry: Entry = {"status": DONE, "upper": b.upper, "lower": b.lower, "hengpi": b.hengpi,
                    "style": b.style, "model": result.model, "served": result.served}
    if n > 1:
        entry["candidates"] = [c.as_dict() for c in (result.candidates or (b,))]
    return entry


def failed_entry(code: str, message: str, field: str | None = None) -> Entry:
    return {"status": FAILED, "error": {"code": code, "message": message, "field": field}}


CANCELLED_ENTRY: Entry = {"status": CANCELLED}


def response_error(response: Any) -> tuple[str, str, str | None] | None:
    """``(code, message, field)`` of an HTTP answer in the service's error shape (nginx's own
    refusals use it too, e.g. ``rate_limited``), else None."""
    try:
        err = response.json()["error"]
        return str(err["code"]), str(err["message"]), err.get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
