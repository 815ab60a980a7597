"""Start (and stop) a whole chunlian topology on one machine: N service instances sharing
one Redis, W Celery workers, and nginx in front, each a child process in its own process
group.

``Cluster(spec).start()`` spawns everything, waits until every instance's ``/readyz`` says
200 and nginx answers ``/nginx-health``, and returns; ``stop()`` stops everything it
started (nginx first, so no new request reaches an instance that is going away), killing
whole process groups, so nothing is left behind even when a child died early or spawned
children of its own. Each child also gets SIGTERM from the kernel if the launching thread
dies (``PR_SET_PDEATHSIG``), so even a SIGKILLed launcher leaves nothing running.

Redis is not started here: it is shared state that outlives a cluster (``--redis-url``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunlian.cluster.commands import WORKER_READY, env_number, spin_env, worker_command
from chunlian.cluster.nginx import (
    ClusterError,
    NginxConfig,
    check_config,
    env_origins,
    nginx_binary,
    nginx_command,
    page_cache_blocker,
    write,
)
from chunlian.cluster.procs import Child, die_with_parent_of, free_port, http_status, quiet
from chunlian.errors import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

Say = Callable[[str], None]


# ---- the spec and the children -------------------------------------------------------------
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
    deadline_s: float | None = None  # default: max(30 s, the service's default deadline)
    access_log: bool = True
    # False: workers load no model and send their items through nginx to the instances'
    # engines at bulk priority (CHUNLIAN_WORKER_ENGINE_URL; docs/guides/bulk-jobs.md: a worker with its
    # own model beside an instance took interactive p99 to 47-51x on an Intel AMX host)
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


class Cluster:
    """The started topology; use as a context manager or call ``start``/``stop``."""

    def __init__(self, spec: ClusterSpec, say: Say = quiet) -> None:
        spec.validate()
        self.spec = spec
        self.say = say
        self.children: list[Child] = []
        self.nginx_cfg: NginxConfig | None = None
        self.prefix: Path | None = None
        self._own_prefix = False
        self._keep_prefix = False
        self._stopped = False
        self._lock = threading.Lock()
        self.ready_s: float | None = None
        self.worker_note: str | None = None
        self.broker_url: str | None = None

    # ---- views ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def local_host(self) -> str:
        """The address a process on this machine dials to reach nginx (a wildcard listen
        address is connected to on loopback)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(self.spec.host, self.spec.host)

    @property
    def local_url(self) -> str:
        """nginx as a process on this machine reaches it."""
        host = self.local_host
        return f"http://{f'[{host}]' if ':' in host and not host.startswith('[') else host}:{self.spec.port}"

    @property
    def instances(self) -> list[Child]:
        return [c for c in self.children if c.role == "instance"]

    @property
    def workers(self) -> list[Child]:
        return [c for c in self.children if c.role == "worker"]

    @property
    def nginx(self) -> Child | None:
        return next((c for c in self.children if c.role == "nginx"), None)

    @property
    def exporter(self) -> Child | None:
        return next((c for c in self.children if c.role == "exporter"), None)

    @property
    def nginx_metrics_url(self) -> str | None:
        ex = self.exporter
        return None if ex is None else f"http://{self.spec.instance_host}:{ex.port}/metrics"

    def describe(self) -> dict[str, Any]:
        """Where everything runs (JSON-able)."""
        ng = self.nginx
        return {
            "url": self.url,
            "ready_s": self.ready_s,
            "prefix": str(self.prefix) if self.prefix else None,
            "redis_url": self.spec.redis_url,
            "broker_url": self.broker_url,
            "nginx": None if ng is None else {
                "pid": ng.pid, "url": self.url, "health": f"{self.url}/nginx-health",
                "config": str(self.nginx_cfg.conf_path) if self.nginx_cfg else None,
                "log": str(ng.log_path), "access_log": str(ng.log_path.with_name("access.log")),
                "client_rate_per_s": self.nginx_cfg.client_rate_per_s if self.nginx_cfg else 0.0,
                "client_burst": self.nginx_cfg.client_burst if self.nginx_cfg else 0,
                "client_rate_dry_run": self.nginx_cfg.rate_limit_dry_run if self.nginx_cfg else False,
                "metrics_url": self.nginx_metrics_url,
            },
            "instances": [
                {"id": c.instance_id, "pid": c.pid, "port": c.port,
                 "url": f"http://{self.spec.instance_host}:{c.port}", "log": str(c.log_path)}
                for c in self.instances
            ],
            "workers": [{"name": c.name, "pid": c.pid, "log": str(c.log_path),
                         "engine_url": None if self.spec.worker_own_model else self.local_url}
                        for c in self.workers],
            "workers_note": self.worker_note,
            "pgids": [c.pid for c in self.children],
        }

    # ---- start ---------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, stop: threading.Event | None = None) -> Cluster:
        """Spawn everything and wait until it is ready; on any failure (or ``stop`` set)
        stop what was started and raise ``ClusterError``."""
        try:
            self._start(stop or threading.Event())
        except BaseException:
            self._keep_prefix = True  # the logs say why; the error names where they are
            self.stop()
            raise
        return self

    def _nginx_options(self, with_workers: bool) -> dict[str, Any]:
        """``spec.nginx_options``, plus, when a per-client rate is set and workers send their
        items through nginx, the address they come from as exempt: bulk work is paced by the
        instances' scheduler (bulk priority), and a client limit would turn its batches into
        429s and retries."""
        options = dict(self.spec.nginx_options)
        if not (with_workers and self.spec.workers and not self.spec.worker_own_model
                and options.get("client_rate_per_s")):
            return options
        host = self.local_host.strip("[]")
        try:
            source = str(ipaddress.ip_address(host))  # a local connection comes from the address it dials
        except ValueError:
            self.say(f"note: the workers reach nginx at {host!r}, not an address: they are not exempt "
                     "from --client-rate (add their address with --rate-limit-exempt)")
            return options
        options["rate_limit_exempt"] = (*options.get("rate_limit_exempt", ()), source)
        self.say(f"workers send items through nginx from {source}: exempt from the per-client rate")
        return options

    def _start(self, stop: threading.Event) -> None:
        spec = self.spec
        t0 = time.monotonic()
        binary = nginx_binary(spec.nginx)  # fail before spawning anything
        env = {**os.environ, **spec.env}
        worker_cmd = worker_command() if spec.workers else None

        broker = spec.broker_url or env.get("CHUNLIAN_BROKER_URL") or None
        if broker is None and worker_cmd is not None:
            broker = spec.redis_url  # the workers and every instance share one job queue
        if broker is not None:
            env["CHUNLIAN_BROKER_URL"] = broker
        elif spec.instances > 1:
            self.say("note: no broker and no workers: bulk jobs run in-process, so a job is known "
                     "only to the instance that took it (use --workers W to share them)")
        self.broker_url = broker

        if spec.prefix is None:
            self.prefix = Path(tempfile.mkdtemp(prefix="chunlian-cluster-"))
            self._own_prefix = True
            if os.geteuid() == 0:  # nginx's workers (nobody) pass through to its page cache
                os.chmod(self.prefix, 0o711)
        else:
            self.prefix = spec.prefix.resolve()
            self.prefix.mkdir(parents=True, exist_ok=True)
        (self.prefix / "logs").mkdir(mode=0o700, exist_ok=True)

        ports = list(spec.instance_ports)
        while len(ports) < spec.instances:
            ports.append(free_port(spec.instance_host, avoid=[spec.port, *ports]))

        default_timeout_s = env_number(env, "default_timeout_ms", int) / 1000.0
        deadline_s = spec.deadline_s or max(30.0, default_timeout_s)
        self.nginx_cfg = NginxConfig(
            upstreams=tuple(f"{spec.instance_host}:{p}" for p in ports),
            prefix=self.prefix / "nginx",
            listen=f"{spec.host}:{spec.port}",
            deadline_s=deadline_s,
            body_limit_bytes=env_number(env, "body_limit_bytes", int),
            cors_origins=env_origins(env),
            worker_processes=spec.nginx_worker_processes,
            access_log=spec.access_log,
            **self._nginx_options(worker_cmd is not None),
        )
        blocker = page_cache_blocker(self.nginx_cfg.prefix) if self.nginx_cfg.page_cache_s else None
        if blocker is not None:
            self.nginx_cfg = dataclasses.replace(self.nginx_cfg, page_cache_s=0)
            self.say(f"note: the page cache is off: nginx's workers (nobody) cannot pass through {blocker} "
                     "to reach it; give --prefix under a directory others may traverse (e.g. /var/lib)")
        write(self.nginx_cfg)
        check_config(binary, self.nginx_cfg)

        threads = spec.torch_threads
        if threads is None and not env.get("CHUNLIAN_TORCH_THREADS"):
            threads = max(1, (os.cpu_count() or 1) // spec.instances)
        host_name = socket.gethostname()
        spin = spin_env(env, spec.instances, spec.workers if spec.worker_own_model else 0)
        for i, port in enumerate(ports, start=1):
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
            child = self._spawn("instance", f"instance-{i}", [sys.executable, "-m", "chunlian.api"], child_env)
            child.port = port
            child.instance_id = child_env["CHUNLIAN_INSTANCE_ID"]
        if worker_cmd is not None:
            for i in range(1, spec.workers + 1):
                child_env = {
                    **env,
                    "CHUNLIAN_REDIS_URL": spec.redis_url,
                    "CHUNLIAN_INSTANCE_ID": f"{host_name}-worker-{i}",
                    "PYTHONUNBUFFERED": "1",
                }
                if not spec.worker_own_model:
                    child_env["CHUNLIAN_WORKER_ENGINE_URL"] = self.local_url
                elif threads is not None:
                    child_env["CHUNLIAN_TORCH_THREADS"] = str(threads)
                self._spawn("worker", f"worker-{i}", worker_cmd, child_env)
        ng = self._spawn("nginx", "nginx", nginx_command(binary, self.nginx_cfg), env)
        ng.log_path = self.nginx_cfg.prefix / "logs" / "error.log"  # where nginx says why
        if spec.nginx_metrics_port is not None:
            self._spawn_exporter(env, avoid=[spec.port, *ports])
        self._wait_ready(stop, t0)
        self.ready_s = round(time.monotonic() - t0, 2)

    def _spawn_exporter(self, env: Mapping[str, str], avoid: list[int]) -> None:
        """``cluster.exporter`` following nginx's access log and reading its stub_status."""
        assert self.nginx_cfg is not None and self.spec.nginx_metrics_port is not None
        spec = self.spec
        port = spec.nginx_metrics_port or free_port(spec.instance_host, avoid=avoid)
        host = spec.instance_host
        cmd = [sys.executable, "-m", "chunlian.cluster.exporter",
               "--status-url", f"{self.local_url}/nginx-status", "--listen", f"{host}:{port}"]
        if spec.access_log:
            cmd += ["--access-log", str(self.nginx_cfg.prefix / "logs" / "access.log")]
        child = self._spawn("exporter", "nginx-exporter", cmd, {**env, "PYTHONUNBUFFERED": "1"})
        child.port = port

    def _spawn(self, role: str, name: str, cmd: list[str], env: Mapping[str, str]) -> Child:
        assert self.prefix is not None
        log_path = self.prefix / "logs" / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by stop()
        try:
            proc = subprocess.Popen(
                cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                preexec_fn=die_with_parent_of(os.getpid()),  # noqa: PLW1509 - prctl + getppid only
            )
        except OSError as e:
            log_file.close()
            raise ClusterError(f"could not start {name} ({cmd[0]}): {e}") from None
        child = Child(role, name, proc, log_path, log_file, cmd=list(cmd), env=dict(env))
        with self._lock:
            self.children.append(child)
        return child

    def respawn(self, old: Child) -> Child | None:
        """Start an exited child again (same command, environment, port and log), in its place
        in ``children``; None once ``stop`` has begun (nothing is started after it)."""
        with self._lock:
            if self._stopped or old not in self.children:
                return None
            self.children.remove(old)
        old.log_file.close()
        child = self._spawn(old.role, old.name, old.cmd, old.env)
        child.port, child.instance_id, child.restarts = old.port, old.instance_id, old.restarts + 1
        with self._lock:
            stopped = self._stopped  # stop() ran meanwhile and may have missed it
        if stopped:
            child.signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5.0)
            child.log_file.close()
            return None
        return child

    def _wait_ready(self, stop: threading.Event, t0: float) -> None:
        spec = self.spec
        deadline = t0 + spec.ready_timeout_s
        nginx_ok = False
        while True:
            for c in self.children:
                if not c.alive:
                    raise ClusterError(
                        f"{c.name} (pid {c.pid}) exited with status {c.proc.returncode} during "
                        f"start-up; the end of its log ({c.log_path}):\n{c.log_tail()}"
                    )
            for c in self.instances:
                if not c.ready and c.port is not None:
                    c.ready = http_status(spec.instance_host, c.port, "/readyz") == 200
            if not nginx_ok:
                nginx_ok = http_status(spec.host, spec.port, "/nginx-health") == 200
            for c in self.workers:
                c.ready = c.ready or WORKER_READY in c.log_tail(40)
            ex = self.exporter
            if ex is not None and not ex.ready and ex.port is not None:
                ex.ready = http_status(spec.instance_host, ex.port, "/metrics") == 200
            if (nginx_ok and all(c.ready for c in self.instances) and all(c.ready for c in self.workers)
                    and (ex is None or ex.ready)
                    and http_status(spec.host, spec.port, "/readyz") == 200):  # the path through nginx
                return
            if time.monotonic() > deadline:
                waiting = [c.name for c in self.children if c.role != "nginx" and not c.ready]
                waiting += [] if nginx_ok else ["nginx"]
                raise ClusterError(
                    f"not ready after {spec.ready_timeout_s:.0f} s (still waiting for "
                    f"{', '.join(waiting) or 'the path through nginx'}); logs in {self.prefix}/logs"
                )
            if stop.wait(0.25):
                raise ClusterError("interrupted during start-up")

    # ---- running -------------------------------------------------------------------------
    def newly_exited(self) -> list[Child]:
        """Children that exited since the last call (each reported once)."""
        out = []
        for c in self.children:
            if not c.alive and not c.reported_exit:
                c.reported_exit = True
                out.append(c)
        return out

    def healthy(self) -> bool:
        """nginx runs and at least one instance runs."""
        ng = self.nginx
        return ng is not None and ng.alive and any(c.alive for c in self.instances)

    # ---- stop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything started (idempotent): nginx gracefully, then instances and workers
        with SIGTERM; whatever is left after the grace period (and anything else in their
        process groups) is SIGKILLed; the temporary prefix is removed."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            children = list(self.children)
        grace = self.spec.stop_grace_s
        ng = [c for c in children if c.role == "nginx"]
        rest = [c for c in children if c.role != "nginx"]
        for c in ng:
            if c.alive:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGQUIT)  # graceful: finish in-flight requests
        self._wait(ng, min(grace, 5.0))
        for c in rest:
            if c.alive:
                c.signal_group(signal.SIGTERM)
        self._wait(rest, grace)
        for c in children:
            c.signal_group(signal.SIGKILL)  # the leader if still there, and any stragglers
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=5.0)
            c.log_file.close()
        if self._own_prefix and not self._keep_prefix and self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)

    @staticmethod
    def _wait(children: Sequence[Child], limit_s: float) -> None:
        end = time.monotonic() + limit_s
        for c in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=max(0.0, end - time.monotonic()))
