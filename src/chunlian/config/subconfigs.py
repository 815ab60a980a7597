"""The five parts of the service's settings, each knob declared once, here: its type,
default, bounds and description (the configuration reference's text). A field ``name`` is
the environment variable ``CHUNLIAN_<NAME>``; names are unique across the parts.

``Settings`` (``chunlian.config``) is made of these parts and reads them from the
environment; each part is also a model of its own (``settings.engine``), which is what a
layer that needs only that part is given: ``EngineConfig`` takes its defaults and bounds
from ``EngineSettings``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import NoDecode

from chunlian.omp import SpinPolicy, usable_cores
from chunlian.rules import DECODING_RULES_VERSION
from chunlian.types import BEST_SEARCH_ROWS
from chunlian.validation import MAX_TIMEOUT_MS, MIN_TIMEOUT_MS

if TYPE_CHECKING:
    from chunlian.data.blocklist import Blocklist

DEFAULT_WARMUP = (
    "新春", "平安", "发财", "福", "吉祥", "如意",
    "春回大地千山秀", "一帆风顺年年好", "天增岁月人增寿", "爆竹声声辞旧岁", "生意兴隆通四海",
)

_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-]+(:\d{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def parse_origins(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``CHUNLIAN_CORS_ORIGINS``: comma-separated ``scheme://host[:port]`` origins, or ``*``
    (``ValueError`` saying what was expected otherwise)."""
    items = value.split(",") if isinstance(value, str) else value
    origins = tuple(s for s in (str(x).strip() for x in items) if s)
    for o in origins:
        if o != "*" and not _ORIGIN.fullmatch(o):
            raise ValueError(f"expected origins like https://example.com or http://localhost:8080 "
                             f"(scheme and host, no path), or *; got {o!r}")
    if "*" in origins and len(origins) > 1:
        raise ValueError(f"expected either * or a list of origins, got both: {','.join(origins)}")
    return origins


def _redis_url(v: str | None) -> str | None:
    if v in (None, ""):
        return None
    if not v.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"expected a redis:// or rediss:// URL, got {v!r}")
    return v


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)


class SubConfig(BaseModel):
    """One part of the settings: frozen, each attribute docstring the knob's description."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    @classmethod
    def defaults(cls) -> Self:
        """The part with every knob at its default."""
        return cls.model_validate({})

    @classmethod
    def check(cls, **values: Any) -> None:
        """Raise ``ValueError`` naming the first of ``values`` outside its knob's declared
        type or bounds (for configurations built from these knobs without the environment)."""
        try:
            cls.model_validate(values)
        except ValidationError as e:
            err = e.errors()[0]
            name = ".".join(str(x) for x in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise ValueError(f"{name}: {msg}, got {err.get('input')!r}" if name else msg) from None


class EngineSettings(SubConfig):
    """The model, the engine's batching and the rules of what it writes."""

    model_path: Path | None = None  # None: the weights shipped in the package
    """Weights to serve: a `.safetensors` file written by `chunlian train`; unset: the shipped weights."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where the model runs: `cpu`, `cuda`, or `auto` (cuda when available)."""
    # 0 = auto: the machine's cores, at most 4 (a 4 M-parameter model gains little beyond);
    # with engine replicas, each gets cores // replicas (resolved_replica_threads). They
    # belong to the engine thread alone (ModelRunner.bind_thread); OpenMP's default
    # wait policy is kept: with OMP_WAIT_POLICY=PASSIVE every op pays a sleep and a wake-up,
    # and miss throughput drops by more than a third (docs/performance.md, "Measurements behind the code")
    torch_threads: int = Field(0, ge=0, le=256)
    """Intra-op threads of each engine; 0: the machine's usable cores (at most 4), shared out among engine replicas."""
    # engine processes behind one dispatcher (engine.replicas), each with its share of the
    # cores (torch_threads each, default cores // replicas) and of max_batch_size and
    # max_queue_size. 1: one engine, in this process.
    # 0 = auto: one per core on a CPU (at most 8 and at most max_batch_size), 1 on cuda
    # (one GPU, one engine)
    engine_replicas: int = Field(0, ge=0, le=64)
    """Engine processes behind one dispatcher, each with its share of the cores, batch rows and queue; 0: one per usable core on a CPU (at most 8), 1 on cuda."""
    batching: Literal["continuous", "static"] = "continuous"
    """`continuous` (sequences join and leave the batch at every step) or `static` (one padded batch at a time; a baseline)."""
    # 128: under a saturating load 128 rows serve more than 64, at a higher p99
    # (docs/performance.md: "Batch size and wait"); below 64 requests in flight nothing
    # changes (newcomers join at once while rows are free)
    max_batch_size: int = Field(128, ge=1, le=1024)
    """Sequences decoded together (KV-cache rows), shared out among engine replicas."""
    # a best search holds 32 rows (engine.tiers): 64 let two run beside the greedy rows; each
    # replica gets this many (a search cannot be split across replicas)
    beam_rows: int = Field(64, ge=0, le=1024)
    """Rows of each engine (replica) for the quality modes' searches, beside `max_batch_size`: 0 (no quality modes: every request is served fast) or at least 32, the rows of one best answer."""
    search_model_path: Path | None = None
    """Weights the quality modes search with (trained with reversed pairs too, `chunlian train --augment-reverse`); unset: the shipped ones."""
    # auto serves best while the measured queue wait is at most this share of the request's
    # timeout (200 ms of the default 10 s), good up to twice that, fast beyond
    step_down_wait_share: float = Field(0.02, ge=0.0, le=1.0)
    """`quality: auto` serves best while interactive requests wait at most this share of their timeout for a batch row, a narrower search up to twice that, greedy beyond."""
    max_wait_ms: float = Field(5.0, ge=0, le=10_000)
    """How long an idle engine waits for companions before it starts a batch."""
    max_queue_size: int = Field(1024, ge=1, le=1_000_000)
    """Requests waiting for a batch row before new ones get 429 `overloaded`."""
    # the bounds are those of a request's own timeout_ms (chunlian.validation)
    default_timeout_ms: int = Field(10_000, ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)
    """Deadline of a request that sets no `timeout_ms`, queue time included; past it: 504."""
    # identical requests in flight share one generation (their answers would be the same);
    # false only for a baseline without it (``chunlian bench compare``'s "before")
    coalesce: bool = True
    """Identical requests in flight share one generation; `false` only for a baseline."""
    bulk_min_share: float = Field(0.125, ge=0.0, le=1.0)  # slots bulk gets even under interactive load
    """Share of batch rows bulk work (batch endpoint, jobs) keeps while interactive requests wait, and holds to while they run."""
    # while a batch runs, newcomers are admitted once this many can join together (or all
    # that wait): a prefill costs a whole forward pass, so one per step would halve decoding.
    # 0 = auto (max_batch_size // 8, at least 1); 1 = admit at every step.
    min_prefill_seqs: int = Field(0, ge=0, le=4096)
    """While a batch runs, newcomers join once this many fit together; 0: max_batch_size / 8; 1: at every step."""
    # the engine thread (and the torch threads it starts) runs this much nicer than the
    # process: when the web server and the model compete for the cores the web server wins,
    # so answers, 429s and deadlines stay on time under overload; when it idles, the engine
    # still gets every cycle. 0 = same priority.
    engine_nice: int = Field(5, ge=0, le=19)
    """How much nicer than the web server the engine's threads run, so answers, 429s and deadlines stay on time under overload; 0: same priority."""
    # how long idle OpenMP threads spin before sleeping (chunlian.omp): "full" is libgomp's
    # own (best alone on the cores: more misses answered; docs/performance.md),
    # "bounded" 10,000 rounds (when model-running processes share the cores: a worker with
    # its own model, several instances); "auto": full for `chunlian serve`, bounded for
    # `chunlian worker` and for the instances `chunlian cluster` starts. GOMP_SPINCOUNT,
    # when set, wins.
    omp_spin: SpinPolicy = "auto"
    """How long idle OpenMP threads spin: `full`, `bounded`, or `auto` (full for `chunlian serve`, bounded for workers and cluster instances). `GOMP_SPINCOUNT`, when set, wins."""
    # the lunar year generated lines may name by its zodiac animal (model.zodiac: 金猴献岁
    # is a Monkey year's line, wrong for a Goat-year campaign): 0 = the coming Spring
    # Festival's, from the date at start-up; -1 = no zodiac rule
    zodiac_year: int = Field(0, ge=-1, le=2200)
    """Lunar year whose zodiac animal generated lines may name (other years' are banned); 0: the coming Spring Festival's; -1: no rule. Part of every cache key."""

    @field_validator("zodiac_year")
    @classmethod
    def _check_zodiac_year(cls, v: int) -> int:
        if 0 < v < 1900:
            raise ValueError("expected a year from 1900 on, 0 (the coming Spring Festival's) or -1 (off)")
        return v

    @field_validator("beam_rows")
    @classmethod
    def _check_beam_rows(cls, v: int) -> int:
        if 0 < v < BEST_SEARCH_ROWS:
            raise ValueError(f"expected 0 (no quality modes) or at least {BEST_SEARCH_ROWS} "
                             "(the rows of one best search)")
        return v

    @model_validator(mode="after")
    def _replicas_fit_the_batch(self) -> Self:
        if self.engine_replicas > self.max_batch_size:
            raise ValueError(
                f"CHUNLIAN_ENGINE_REPLICAS must be at most CHUNLIAN_MAX_BATCH_SIZE ({self.max_batch_size}): "
                f"each replica needs a batch row; got {self.engine_replicas}")
        return self

    def resolved_zodiac_year(self, today: dt.date | None = None) -> int | None:
        """``zodiac_year`` with 0 resolved from ``today`` (default: the local date); None when off."""
        if self.zodiac_year < 0:
            return None
        if self.zodiac_year:
            return self.zodiac_year
        from chunlian.model.zodiac import campaign_year

        return campaign_year(today or dt.date.today())

    def generation_blocklist(self) -> Blocklist:
        """The bans on generated text: the safety blocklist plus the off-year zodiac terms."""
        from chunlian.data.blocklist import default_blocklist
        from chunlian.model.zodiac import with_zodiac

        return with_zodiac(default_blocklist(), self.resolved_zodiac_year())

    @property
    def rules_tag(self) -> str:
        """What, besides the model and the request, decides an answer (part of cache keys):
        the decoding rules' version and the zodiac year."""
        year = self.resolved_zodiac_year()
        rules = f"rules={DECODING_RULES_VERSION}"
        return rules if year is None else f"{rules};zodiac={year}"

    def resolved_torch_threads(self) -> int:
        """``torch_threads``, with 0 resolved to the machine's cores (at most 4)."""
        return self.torch_threads or max(1, min(4, os.cpu_count() or 1))

    def resolved_engine_replicas(self) -> int:
        """``engine_replicas``, with 0 resolved: on a CPU, as many as the usable cores hold
        at ``torch_threads`` each (one per core when that is 0; at most 8 and at most
        ``max_batch_size``: each replica needs a row), one on cuda. An explicit
        ``TORCH_THREADS=2`` on 2 cores is therefore one engine with both: two replicas of 2
        threads each would be four spinning OpenMP threads on two cores, which serve a small
        fraction of the misses one engine does (``docs/performance.md``)."""
        if self.engine_replicas:
            return self.engine_replicas
        if self.resolved_device() == "cuda":
            return 1
        return max(1, min(8, usable_cores() // max(1, self.torch_threads), self.max_batch_size))

    def resolved_replica_threads(self, replicas: int) -> int:
        """Torch threads of each of ``replicas`` engines: ``torch_threads`` when set, else
        the usable cores shared out (at least 1 each)."""
        return self.torch_threads or max(1, usable_cores() // replicas)

    @property
    def engine_in_child(self) -> bool:
        """Whether the model runs in child processes (one, or several replicas)."""
        return self.resolved_engine_replicas() > 1

    def resolved_device(self) -> str:
        """``device`` with ``auto`` resolved (``model.device``)."""
        from chunlian.model.device import resolve_device

        return resolve_device(self.device)


class CacheSettings(SubConfig):
    """The result cache: in-process, and shared through Redis."""

    cache_size: int = Field(100_000, ge=0)
    """Entries of the in-process LRU result cache; 0 turns it off."""
    cache_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    """How long cached answers live (in-process and Redis)."""
    redis_url: str | None = None
    """Shared result cache, e.g. `redis://127.0.0.1:6379/0`; unset: in-process cache only."""
    # api.upgrade: lines asked more than once whose cached answer is not the best mode's
    # are re-answered in the best mode while the engine idles (cancelled the moment live
    # work arrives); needs the quality modes (beam_rows > 0)
    idle_upgrade: bool = True
    """While the engine idles, re-answer in the best mode the lines asked more than once whose cached answer is not the best mode's (most asked first), and cache that answer."""
    idle_upgrade_after_ms: float = Field(200.0, gt=0, le=60_000)
    """How long the engine must have been idle (no live or queued request) before an idle upgrade starts."""
    hot_lines: int = Field(10_000, ge=1, le=10_000_000)
    """Lines the idle upgrade keeps count of (the least asked half is forgotten when full)."""

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, v: str | None) -> str | None:
        return _redis_url(v)


class JobsSettings(SubConfig):
    """Bulk jobs: the Celery broker and job store, task limits and the workers."""

    broker_url: str | None = None
    """Celery broker (and job store) for bulk jobs, e.g. `redis://127.0.0.1:6379/1`; unset: jobs run inside the instance."""
    job_result_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    """How long a bulk job and its results are kept."""
    job_soft_time_limit_s: float = Field(30.0, gt=0)
    """Soft time limit of one Celery task (a chunk of a job's items)."""
    job_hard_time_limit_s: float = Field(60.0, gt=0)
    """Hard time limit of one Celery task; must exceed the soft limit."""
    job_chunk_size: int = Field(50, ge=1, le=10_000)  # items per Celery task
    """Items per Celery task."""
    job_queue: str = Field("chunlian.jobs", min_length=1, max_length=200)  # Celery queue name
    """Name of the Celery queue bulk jobs go to."""
    job_visibility_timeout_s: float | None = Field(None, gt=0)  # None: derived from the hard limit
    """How long the broker waits before it hands an unacknowledged task to another worker; unset: derived from the hard limit."""
    jobs_metrics_every_s: float = Field(15.0, ge=0.05, le=3600)  # how often /metrics' job gauges read the store
    """How often the bulk-job gauges of `/metrics` read the job store."""
    # a `chunlian worker` process (and its pool) runs this much nicer: bulk work yields the
    # cores to interactive instances on the same machine and takes them all when those idle
    worker_nice: int = Field(10, ge=0, le=19)
    """How much nicer a `chunlian worker` process runs, so bulk jobs yield the cores to interactive instances."""
    worker_engine_url: str | None = None
    """Set on a `chunlian worker` (by `--engine-url` or `chunlian cluster`): the worker loads no model and sends its items to this service's engine at bulk priority."""

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, v: str | None) -> str | None:
        return _redis_url(v)

    @field_validator("worker_engine_url")
    @classmethod
    def _check_engine_url(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v

    @model_validator(mode="after")
    def _hard_limit_above_soft(self) -> Self:
        if self.job_hard_time_limit_s <= self.job_soft_time_limit_s:
            raise ValueError(f"CHUNLIAN_JOB_HARD_TIME_LIMIT_S must exceed the soft limit "
                             f"({self.job_soft_time_limit_s}), got {self.job_hard_time_limit_s}")
        return self


class HttpSettings(SubConfig):
    """The web server: where it listens, what it accepts, how it starts and stops."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port to listen on."""
    # on SIGTERM, how long requests in flight may take to finish (api.drain); nginx lets a
    # request ask for up to 30 s by default: Kubernetes' terminationGracePeriodSeconds
    # (deploy/k8s) leaves room above it
    drain_timeout_s: float = Field(30.0, ge=0, le=3600)
    """On SIGTERM, how long requests in flight may take to finish before the instance exits."""
    api_keys: str = ""  # comma-separated; empty: the bulk endpoints (jobs, batch) are open
    """Comma-separated keys that `X-API-Key` must match on the bulk endpoints (`/v1/jobs`, `/v1/couplets/batch`); empty: open."""
    # browser origins allowed to call the API from another site (a campaign page on a CDN):
    # comma-separated "https://host[:port]", or "*"; empty: same origin only (no CORS headers)
    cors_origins: Annotated[tuple[str, ...], NoDecode] = ()
    """Browser origins allowed to call the API from another site: comma-separated `https://host[:port]`, or `*`; empty: same origin only."""
    body_limit_bytes: int = Field(1_000_000, ge=1024)
    """Largest request body; larger ones get 413 `body_too_large`."""
    log_level: LogLevel = "INFO"
    """`DEBUG`, `INFO`, `WARNING` or `ERROR` (any case)."""
    warmup: Annotated[tuple[str, ...], NoDecode] = DEFAULT_WARMUP  # comma-separated in env
    """Comma-separated lines and keywords generated and cached at start-up, before `/readyz` turns ready."""
    # once warm, move every object the start-up made (torch, the model, the framework: some
    # 400,000) out of the cyclic garbage collector's reach (gc.freeze): a full collection
    # then walks only what serving allocates instead of stopping the whole process (both
    # threads: it holds the interpreter lock) for a large fraction of a second under load
    # (docs/performance.md, "Measurements behind the code")
    gc_freeze: bool = True
    """Once warm, exempt the start-up's objects from Python's cyclic garbage collector (shorter pauses)."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, v: object) -> object:
        # ``--log-level warning`` is what uvicorn and most tools accept: the case is no error
        if not isinstance(v, str):
            return v
        level = v.strip().upper()
        if level not in LOG_LEVELS:  # said here, so that the message shows what was typed
            raise ValueError(f"expected one of {', '.join(LOG_LEVELS)} (any case)")
        return level

    @field_validator("warmup", mode="before")
    @classmethod
    def _split_warmup(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(s.strip() for s in v.split(",") if s.strip())
        return v

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, v: object) -> object:
        return parse_origins(v) if isinstance(v, (str, list, tuple)) else v

    @property
    def api_key_set(self) -> frozenset[str]:
        return frozenset(k.strip() for k in self.api_keys.split(",") if k.strip())


def _instance_id() -> str:
    return f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ClusterSettings(SubConfig):
    """This instance among the others behind one front (`chunlian cluster`, Kubernetes)."""

    instance_id: str = Field(default_factory=_instance_id)
    """Name of this instance in `X-Chunlian-Instance`, `/healthz` and logs; default: host name, process id and a random suffix."""


SUBCONFIGS: dict[str, type[SubConfig]] = {
    "engine": EngineSettings, "cache": CacheSettings, "jobs": JobsSettings,
    "http": HttpSettings, "cluster": ClusterSettings,
}
