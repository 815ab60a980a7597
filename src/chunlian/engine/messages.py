"""What crosses the pipe between a process client (``engine.process.ProcessEngine``) and its
engine process: typed messages, and errors as plain data.

Parent → child: ``Add``, ``Abort``, ``Stop``. Child → parent: ``Ready`` or ``Failed`` once,
then ``Answers`` (every request that ended in one core step: one pipe write, one wake-up of
the parent's event loop), ``Stats`` about every ``STATS_EVERY_S``, and ``Stopped`` last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chunlian import errors as E
from chunlian.types import CoupletRequest, CoupletResult

ErrorWire = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class Add:
    req_id: int
    request: CoupletRequest
    timeout_s: float  # the deadline, counted from the child's receipt


@dataclass(frozen=True)
class Abort:
    req_ids: tuple[int, ...]


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    model_tag: str
    search_tag: str  # the weights that write searched answers (``EngineCore.search_tag``)


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Answer:
    req_id: int
    result: CoupletResult | None = None
    error: ErrorWire | None = None


@dataclass(frozen=True)
class Answers:
    answers: tuple[Answer, ...]


@dataclass(frozen=True)
class Stats:
    stats: dict[str, Any]  # ``EngineStats`` fields
    steps: tuple[tuple[int, float, int], ...]  # (batch size, step seconds, tokens) per step


@dataclass(frozen=True)
class Stopped:
    pass


def encode_error(e: BaseException) -> ErrorWire:
    """An error as plain data: (class name in ``chunlian.errors``, message, extra fields)."""
    if not isinstance(e, E.ChunlianError):
        return "ModelError", f"generation failed: {type(e).__name__}", {}
    extra: dict[str, Any] = {}
    if isinstance(e, E.Overloaded):
        extra["retry_after_s"] = e.retry_after_s
    if isinstance(e, E.InvalidInput):
        extra["field"] = e.field
    return type(e).__name__, str(e), extra


def decode_error(wire: ErrorWire) -> E.ChunlianError:
    name, message, extra = wire
    cls = getattr(E, name, None)
    if not (isinstance(cls, type) and issubclass(cls, E.ChunlianError)):
        return E.ModelError(message)
    if cls is E.Overloaded:
        return E.Overloaded(message, float(extra.get("retry_after_s", 1.0)))
    if cls is E.InvalidInput:
        return E.InvalidInput(message, extra.get("field"))
    return cls(message)
