"""``EngineClient``: the one protocol every way of reaching an engine core implements.

    Engine            (engine.engine)    the core on a thread of this process
    ProcessEngine     (engine.process)   the core in a child process, over a pipe
    ReplicatedEngine  (engine.replicas)  several process clients, least loaded first

The service, the job runners and the benchmarks hold an ``EngineClient`` and never know
which one. Coalescing of identical requests happens once, in the client that faces the
callers (``engine.coalesce``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from chunlian.engine.stats import EngineStats, StepReport
from chunlian.types import CoupletRequest, CoupletResult


class EngineClient(Protocol):
    """What a caller needs of an engine."""

    @property
    def model_tag(self) -> str:
        """``name@version`` of the model answering."""
        ...

    @property
    def search_tag(self) -> str:
        """``name@version`` of the weights that write searched answers (best, good): the
        search weights', or ``model_tag`` where the engine has none."""
        ...

    @property
    def stats(self) -> EngineStats:
        """The engine's counters, read by the metrics at scrape time."""
        ...

    @property
    def running(self) -> bool:
        """Whether requests can be answered now."""
        ...

    async def start(self) -> None:
        """Start the step loop (and load the model where the client loads it)."""
        ...

    async def stop(self) -> None:
        """Stop; every pending request fails with ``EngineStopped``."""
        ...

    async def generate(self, req: CoupletRequest) -> CoupletResult:
        """One request's answer; raises ``Overloaded``, ``DeadlineExceeded``, ``Cancelled``,
        ``InvalidInput``, ``ModelError`` or ``EngineStopped``."""
        ...

    def add_step_listener(self, fn: Callable[[StepReport], None]) -> None:
        """Call ``fn(StepReport)`` after each model step."""
        ...
