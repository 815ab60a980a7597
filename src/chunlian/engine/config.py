"""What the engine reads of the service's settings, resolved once: ``EngineConfig``.

The service's ``Settings`` hold every knob of an instance (HTTP, cache, jobs, ...) and some
that are still choices (``device = auto``, ``torch_threads = 0``). The engine gets only its
own part (``EngineSettings``), with every choice made: ``EngineConfig.from_settings`` is the
one place that turns settings into an engine configuration. The knobs' defaults and bounds
are ``EngineSettings``' own (declared once, in ``chunlian.config.subconfigs``). Engine
replicas each get a copy with their share of the rows and the queue
(``engine.replicas.replica_config``), sent to their process as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chunlian.config import EngineSettings
from chunlian.types import BatchingMode, CoupletRequest

if TYPE_CHECKING:
    from chunlian.data.blocklist import Blocklist

DEVICES = ("cpu", "cuda")
KNOBS = EngineSettings.defaults()  # the engine knobs' defaults


@dataclass(frozen=True)
class EngineConfig:
    """One engine's configuration (or, with ``replicas`` > 1, the dispatcher's over them)."""

    max_batch_size: int = KNOBS.max_batch_size  # sequences decoded together: KV-cache rows
    max_queue_size: int = KNOBS.max_queue_size  # waiting requests before new ones are refused
    max_wait_ms: float = KNOBS.max_wait_ms  # how long an idle engine waits for companions
    default_timeout_ms: int = KNOBS.default_timeout_ms  # deadline of a request that sets none
    batching: BatchingMode = KNOBS.batching
    coalesce: bool = KNOBS.coalesce  # identical requests in flight share one generation
    bulk_min_share: float = KNOBS.bulk_min_share  # share of the rows bulk work keeps under interactive load
    min_prefill_seqs: int = KNOBS.min_prefill_seqs  # newcomers that join a running batch together; 0: rows // 8
    engine_nice: int = KNOBS.engine_nice  # how much nicer than the web server the engine thread runs
    device: str = "cpu"  # resolved: "cpu" or "cuda"
    torch_threads: int = 0  # intra-op threads of an engine built from this; 0: torch's own setting
    replicas: int = 1  # engines behind one dispatcher, each in its own process when > 1
    replica_threads: int = 0  # intra-op threads of each of those replicas; 0: torch's own setting
    model_path: Path | None = KNOBS.model_path  # None: the shipped weights
    beam_rows: int = KNOBS.beam_rows  # each engine's rows for the quality modes' searches; 0: none
    search_model_path: Path | None = KNOBS.search_model_path  # None: the shipped reverse-trained weights
    step_down_wait_share: float = KNOBS.step_down_wait_share  # when auto steps down (engine.tiers)
    # the bans on generated text; None: the safety blocklist alone (``ModelRunner``'s default)
    blocklist: Blocklist | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # the knobs' own bounds; threads as torch_threads', replicas as engine_replicas' (resolved: >= 1)
        EngineSettings.check(
            max_batch_size=self.max_batch_size, max_queue_size=self.max_queue_size,
            max_wait_ms=self.max_wait_ms, default_timeout_ms=self.default_timeout_ms,
            batching=self.batching, coalesce=self.coalesce, bulk_min_share=self.bulk_min_share,
            min_prefill_seqs=self.min_prefill_seqs, engine_nice=self.engine_nice,
            engine_replicas=self.replicas, beam_rows=self.beam_rows,
            step_down_wait_share=self.step_down_wait_share,
        )
        for threads in (self.torch_threads, self.replica_threads):
            EngineSettings.check(torch_threads=threads)
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1 (resolved), got {self.replicas}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES} (resolved), got {self.device!r}")

    def timeout_s(self, req: CoupletRequest) -> float:
        """The request's deadline from now, queue time included: its own, else the default."""
        return req.timeout_s if req.timeout_s is not None else self.default_timeout_ms / 1000

    @property
    def in_child(self) -> bool:
        """Whether the model runs in child processes (the replicas')."""
        return self.replicas > 1

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> EngineConfig:
        """The engine's part of ``settings`` (``Settings`` or its ``engine`` part), every
        automatic choice made: the device (``resolved_device``), the replicas and each
        one's torch threads, the generation blocklist (safety and zodiac terms)."""
        replicas = settings.resolved_engine_replicas()
        return cls(
            max_batch_size=settings.max_batch_size, max_queue_size=settings.max_queue_size,
            max_wait_ms=settings.max_wait_ms, default_timeout_ms=settings.default_timeout_ms,
            batching=settings.batching, coalesce=settings.coalesce,
            bulk_min_share=settings.bulk_min_share, min_prefill_seqs=settings.min_prefill_seqs,
            engine_nice=settings.engine_nice, device=settings.resolved_device(),
            torch_threads=settings.resolved_torch_threads(), replicas=replicas,
            replica_threads=settings.resolved_replica_threads(replicas), model_path=settings.model_path,
            beam_rows=settings.beam_rows, search_model_path=settings.search_model_path,
            step_down_wait_share=settings.step_down_wait_share, blocklist=settings.generation_blocklist(),
        )
