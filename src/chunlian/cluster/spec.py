"""What ``chunlian cluster`` starts, and what each child gets from it: ``ClusterSpec`` and
the derived pieces (the broker, the prefix, the instances' ports and torch threads, nginx's
config, and every child's environment)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunlian.cluster.nginx import NginxConfig, front_deadline_s, page_cache_blocker
from chunlian.cluster.procs import free_port
from chunlian.config import Settings
from chunlian.errors import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

Say = Callable[[str], None]


@dataclass
class ClusterSpec:
    """What to start. Ports of 0 / None are picked free."""

    instances: int = 2
    port: int = 8000  # nginx listens here
    host: str = "127.0.0.1"  # nginx listens on this address
    workers: int = 0
    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = None  # Celery's; default $CHUNLIAN_BROKER_URL, else redis_url when workers > 0
    torch_threads: int | None = None  # None: cores // instances (at least 1)
    instance_ports: Sequence[int] = ()  # default: free loopback ports
    instance_host: str = "127.0.0.1"
    prefix: Path | None = None  # default: a temporary directory, removed by stop()
    ready_timeout_s: float = 120.0
    stop_grace_s: float = 15.0
    nginx: str | None = None  # the nginx binary; default: on PATH or /usr/sbin/nginx
    nginx_worker_processes: str = "auto"
    deadline_s: float | None = None  # default: nginx.front_deadline_s of the service's default deadline
    access_log: bool = True
    # False: workers load no model and send their items through nginx to the instances'
    # engines at bulk priority (CHUNLIAN_WORKER_ENGINE_URL): a worker with its own model
    # beside an instance takes the cores its engine needs, and interactive p99 grows many
    # times over (docs/guides/deploy.md gives the figures)
    worker_own_model: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # extra env for every child
    # more NginxConfig fields (the per-client rate limit: client_rate_per_s, client_burst,
    # rate_limit_exempt, trusted_proxies, rate_limit_dry_run); NginxConfig.validate checks them
    nginx_options: Mapping[str, Any] = field(default_factory=dict)
    # the nginx exporter (cluster.exporter: its refusals and connections on /metrics) on
    # instance_host:nginx_metrics_port (0: a free port; None: not started)
    nginx_metrics_port: int | None = 0

    def validate(self) -> None:
        if self.instances < 1:
            raise ConfigError(f"--instances must be at least 1, got {self.instances}")
        if self.workers < 0:
            raise ConfigError(f"--workers must be 0 or more, got {self.workers}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be 0-65535, got {self.port}")
        if self.nginx_metrics_port is not None and not 0 <= self.nginx_metrics_port < 65536:
            raise ConfigError(f"--nginx-metrics-port must be 0-65535, got {self.nginx_metrics_port}")
        if self.instance_ports and len(self.instance_ports) != self.instances:
            raise ConfigError(f"give {self.instances} instance ports, got {len(self.instance_ports)}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError(f"--torch-threads must be at least 1, got {self.torch_threads}")
        for flag, url in (("--redis-url", self.redis_url), ("--broker-url", self.broker_url)):
            if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError(f"{flag} must be a redis:// URL, got {url!r}")


def broker_url(spec: ClusterSpec, env: Mapping[str, str], with_workers: bool) -> str | None:
    """Celery's broker: the spec's, else ``$CHUNLIAN_BROKER_URL``, else (with workers) the
    shared Redis, so the workers and every instance share one job queue."""
    broker = spec.broker_url or env.get("CHUNLIAN_BROKER_URL") or None
    if broker is None and with_workers:
        broker = spec.redis_url
    return broker


def make_prefix(prefix: Path | None) -> tuple[Path, bool]:
    """The cluster's directory (with ``logs/``) and whether it is a temporary one of its own."""
    own = prefix is None
    if prefix is None:
        path = Path(tempfile.mkdtemp(prefix="chunlian-cluster-"))
        if os.geteuid() == 0:  # nginx's workers (nobody) pass through to its page cache
            os.chmod(path, 0o711)
    else:
        path = prefix.resolve()
        path.mkdir(parents=True, exist_ok=True)
    (path / "logs").mkdir(mode=0o700, exist_ok=True)
    return path, own


def instance_ports(spec: ClusterSpec) -> list[int]:
    """The spec's instance ports, else free ones on ``instance_host`` (never nginx's)."""
    ports = list(spec.instance_ports)
    while len(ports) < spec.instances:
        ports.append(free_port(spec.instance_host, avoid=[spec.port, *ports]))
    return ports


def torch_threads(spec: ClusterSpec, env: Mapping[str, str]) -> int | None:
    """Each model-running child's torch threads: the spec's, else the cores shared among
    the instances; None leaves ``CHUNLIAN_TORCH_THREADS`` from the environment in force."""
    if spec.torch_threads is None and not env.get("CHUNLIAN_TORCH_THREADS"):
        return max(1, (os.cpu_count() or 1) // spec.instances)
    return spec.torch_threads


def nginx_options_for(spec: ClusterSpec, local_host: str, with_workers: bool, say: Say) -> dict[str, Any]:
    """``spec.nginx_options``, plus, when a per-client rate is set and workers send their
    items through nginx (at ``local_host``), the address they come from as exempt: bulk
    work is paced by the instances' scheduler (bulk priority), and a client limit would
    turn its batches into 429s and retries."""
    options = dict(spec.nginx_options)
    if not (with_workers and spec.workers and not spec.worker_own_model and options.get("client_rate_per_s")):
        return options
    host = local_host.strip("[]")
    try:
        source = str(ipaddress.ip_address(host))  # a local connection comes from the address it dials
    except ValueError:
        say(f"note: the workers reach nginx at {host!r}, not an address: they are not exempt "
            "from --client-rate (add their address with --rate-limit-exempt)")
        return options
    options["rate_limit_exempt"] = (*options.get("rate_limit_exempt", ()), source)
    say(f"workers send items through nginx from {source}: exempt from the per-client rate")
    return options


def nginx_config(
    spec: ClusterSpec, settings: Settings, ports: Sequence[int], prefix: Path,
    options: Callable[[], Mapping[str, Any]],
) -> tuple[NginxConfig, Path | None]:
    """nginx in front of the instances on ``ports`` (their ``settings``: its deadline, body
    limit and CORS origins follow theirs), and what blocks its page cache (the config then
    has the page cache off), or None. ``options``: more ``NginxConfig`` fields."""
    cfg = NginxConfig(
        upstreams=tuple(f"{spec.instance_host}:{p}" for p in ports),
        prefix=prefix / "nginx",
        listen=f"{spec.host}:{spec.port}",
        deadline_s=spec.deadline_s or front_deadline_s(settings.default_timeout_ms),
        body_limit_bytes=settings.body_limit_bytes,
        cors_origins=settings.cors_origins,
        worker_processes=spec.nginx_worker_processes,
        access_log=spec.access_log,
        **options(),
    )
    blocker = page_cache_blocker(cfg.prefix) if cfg.page_cache_s else None
    if blocker is not None:
        cfg = dataclasses.replace(cfg, page_cache_s=0)
    return cfg, blocker


def instance_env(
    spec: ClusterSpec, env: Mapping[str, str], port: int, host_name: str,
    threads: int | None, spin: Mapping[str, str],
) -> dict[str, str]:
    """The environment of the service instance on ``port``."""
    child_env = {
        **env,
        "CHUNLIAN_HOST": spec.instance_host,
        "CHUNLIAN_PORT": str(port),
        "CHUNLIAN_REDIS_URL": spec.redis_url,
        "CHUNLIAN_INSTANCE_ID": f"{host_name}:{port}",
        "PYTHONUNBUFFERED": "1",
        # the instances are this machine's data parallelism: one engine each,
        # unless the operator asked for replicas inside them too
        "CHUNLIAN_ENGINE_REPLICAS": env.get("CHUNLIAN_ENGINE_REPLICAS", "1"),
        **spin,
    }
    if threads is not None:
        child_env["CHUNLIAN_TORCH_THREADS"] = str(threads)
    return child_env


def worker_env(
    spec: ClusterSpec, env: Mapping[str, str], i: int, host_name: str, threads: int | None, engine_url: str,
) -> dict[str, str]:
    """The environment of Celery worker ``i``: without a model of its own it sends its items
    to ``engine_url`` (nginx); with one, it gets the instances' torch threads."""
    child_env = {
        **env,
        "CHUNLIAN_REDIS_URL": spec.redis_url,
        "CHUNLIAN_INSTANCE_ID": f"{host_name}-worker-{i}",
        "PYTHONUNBUFFERED": "1",
    }
    if not spec.worker_own_model:
        child_env["CHUNLIAN_WORKER_ENGINE_URL"] = engine_url
    elif threads is not None:
        child_env["CHUNLIAN_TORCH_THREADS"] = str(threads)
    return child_env
