"""What the engine reads of the service's settings, resolved once: ``EngineConfig``.

The service's ``Settings`` hold every knob of an instance (HTTP, cache, jobs, ...) and some
that are still choices (``device = auto``, ``torch_threads = 0``). The engine gets only its
own fields, with every choice made: ``EngineConfig.from_settings`` is the one place that
turns settings into an engine configuration. Engine replicas each get a copy with their
share of the rows and the queue (``engine.replicas.replica_config``), sent to their process
as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from chunlian.types import BatchingMode

if TYPE_CHECKING:
    from chunlian.config import Settings
    from chunlian.data.blocklist import Blocklist

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's configuration (or, with ``replicas`` > 1, the dispatcher's over them)."""

    max_batch_size: int = 128  # sequences decoded together: KV-cache rows
    max_queue_size: int = 1024  # waiting requests before new ones are refused
    max_wait_ms: float = 5.0  # how long an idle engine waits for companions
    default_timeout_ms: int = 10_000  # deadline of a request that sets none, queue time included
    batching: BatchingMode = "continuous"
    coalesce: bool = True  # identical requests in flight share one generation
    bulk_min_share: float = 0.125  # share of the rows bulk work keeps under interactive load
    min_prefill_seqs: int = 0  # newcomers that join a running batch together; 0: rows // 8
    engine_nice: int = 5  # how much nicer than the web server the engine thread runs
    device: str = "cpu"  # resolved: "cpu" or "cuda"
    torch_threads: int = 0  # intra-op threads of an engine built from this; 0: torch's own setting
    replicas: int = 1  # engines behind one dispatcher, each in its own process when > 1
    replica_threads: int = 0  # intra-op threads of each of those replicas; 0: torch's own setting
    model_path: Path | None = None  # None: the shipped weights
    # the bans on generated text; None: the safety blocklist alone (``ModelRunner``'s default)
    blocklist: Blocklist | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _at_least(1, max_batch_size=self.max_batch_size, max_queue_size=self.max_queue_size,
                  default_timeout_ms=self.default_timeout_ms, replicas=self.replicas)
        _at_least(0, max_wait_ms=self.max_wait_ms, min_prefill_seqs=self.min_prefill_seqs,
                  engine_nice=self.engine_nice, torch_threads=self.torch_threads,
                  replica_threads=self.replica_threads)
        if self.batching not in get_args(BatchingMode):
            raise ValueError(f"batching must be one of {get_args(BatchingMode)}, got {self.batching!r}")
        if not 0.0 <= self.bulk_min_share <= 1.0:
            raise ValueError(f"bulk_min_share must be in [0, 1], got {self.bulk_min_share}")
        if self.engine_nice > 19:
            raise ValueError(f"engine_nice must be at most 19, got {self.engine_nice}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES} (resolved), got {self.device!r}")
        if self.replicas > self.max_batch_size:
            raise ValueError(f"replicas ({self.replicas}) must be at most max_batch_size "
                             f"({self.max_batch_size}): each replica needs a batch row")

    @property
    def in_child(self) -> bool:
        """Whether the model runs in child processes (the replicas')."""
        return self.replicas > 1

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        """The engine's part of ``settings``, every automatic choice made: the device
        (``Settings.resolved_device``), the replicas and each one's torch threads, the
        generation blocklist (safety and zodiac terms)."""
        replicas = settings.resolved_engine_replicas()
        return cls(
            max_batch_size=settings.max_batch_size, max_queue_size=settings.max_queue_size,
            max_wait_ms=settings.max_wait_ms, default_timeout_ms=settings.default_timeout_ms,
            batching=settings.batching, coalesce=settings.coalesce,
            bulk_min_share=settings.bulk_min_share, min_prefill_seqs=settings.min_prefill_seqs,
            engine_nice=settings.engine_nice, device=settings.resolved_device(),
            torch_threads=settings.resolved_torch_threads(), replicas=replicas,
            replica_threads=settings.resolved_replica_threads(replicas), model_path=settings.model_path,
            blocklist=settings.generation_blocklist(),
        )


def _at_least(low: float, **values: float) -> None:
    for name, value in values.items():
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
