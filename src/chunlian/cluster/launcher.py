"""Start (and stop) a whole chunlian topology on one machine: N service instances sharing
one Redis, W Celery workers, and nginx in front, each a child process in its own process
group.

``Cluster(spec, settings).start()`` spawns everything, waits until every instance's ``/readyz`` says
200 and nginx answers ``/nginx-health``, and returns; ``stop()`` stops everything it
started (nginx first, so no new request reaches an instance that is going away), killing
whole process groups, so nothing is left behind even when a child died early or spawned
children of its own. Each child also gets SIGTERM from the kernel if the launching thread
dies (``PR_SET_PDEATHSIG``), so even a SIGKILLed launcher leaves nothing running.

Redis is not started here: it is shared state that outlives a cluster (``--redis-url``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chunlian.cluster.commands import WORKER_READY, exporter_command, spin_env, worker_command
from chunlian.cluster.nginx import (
    ClusterError,
    NginxConfig,
    check_config,
    nginx_binary,
    nginx_command,
    write,
)
from chunlian.cluster.procs import Child, free_port, http_status, quiet, spawn
from chunlian.cluster.spec import (
    DEFAULT_REDIS_URL,
    ClusterSpec,
    Say,
    broker_url,
    instance_env,
    instance_ports,
    make_prefix,
    nginx_config,
    nginx_options_for,
    torch_threads,
    worker_env,
)
from chunlian.config import Settings

__all__ = ["DEFAULT_REDIS_URL", "Cluster", "ClusterSpec"]


class Cluster:
    """The started topology; use as a context manager or call ``start``/``stop``."""

    def __init__(self, spec: ClusterSpec, settings: Settings, say: Say = quiet) -> None:
        """``settings``: the instances' settings, read by the caller from the environment they
        get (``os.environ`` and ``spec.env``), so a bad one fails before anything starts."""
        spec.validate()
        self.spec = spec
        self.settings = settings
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
        """``spec.nginx_options``, the workers' address exempt from a per-client rate
        (``spec.nginx_options_for``)."""
        return nginx_options_for(self.spec, self.local_host, with_workers, self.say)

    def _start(self, stop: threading.Event) -> None:
        spec = self.spec
        t0 = time.monotonic()
        binary = nginx_binary(spec.nginx)  # fail before spawning anything
        env = {**os.environ, **spec.env}
        worker_cmd = worker_command() if spec.workers else None
        self._set_broker(env, with_workers=worker_cmd is not None)
        self.prefix, self._own_prefix = make_prefix(spec.prefix)
        ports = instance_ports(spec)
        self._write_nginx_config(binary, ports, with_workers=worker_cmd is not None)
        threads = torch_threads(spec, env)
        host_name = socket.gethostname()
        self._spawn_instances(env, ports, host_name, threads)
        if worker_cmd is not None:
            self._spawn_workers(env, worker_cmd, host_name, threads)
        self._spawn_nginx(binary, env)
        if spec.nginx_metrics_port is not None:
            self._spawn_exporter(env, avoid=[spec.port, *ports])
        self._wait_ready(stop, t0)
        self.ready_s = round(time.monotonic() - t0, 2)

    def _set_broker(self, env: dict[str, str], with_workers: bool) -> None:
        """Celery's broker into ``env`` (every child's), or a note that jobs stay in-process."""
        broker = broker_url(self.spec, env, with_workers)
        if broker is not None:
            env["CHUNLIAN_BROKER_URL"] = broker
        elif self.spec.instances > 1:
            self.say("note: no broker and no workers: bulk jobs run in-process, so a job is known "
                     "only to the instance that took it (use --workers W to share them)")
        self.broker_url = broker

    def _write_nginx_config(self, binary: str, ports: list[int], with_workers: bool) -> None:
        assert self.prefix is not None
        self.nginx_cfg, blocker = nginx_config(
            self.spec, self.settings, ports, self.prefix, lambda: self._nginx_options(with_workers))
        if blocker is not None:
            self.say(f"note: the page cache is off: nginx's workers (nobody) cannot pass through {blocker} "
                     "to reach it; give --prefix under a directory others may traverse (e.g. /var/lib)")
        write(self.nginx_cfg)
        check_config(binary, self.nginx_cfg)

    def _spawn_instances(self, env: Mapping[str, str], ports: list[int], host_name: str, threads: int | None) -> None:
        spec = self.spec
        spin = spin_env(env, spec.instances, spec.workers if spec.worker_own_model else 0)
        for i, port in enumerate(ports, start=1):
            child_env = instance_env(spec, env, port, host_name, threads, spin)
            child = self._spawn("instance", f"instance-{i}", [sys.executable, "-m", "chunlian.api"], child_env)
            child.port = port
            child.instance_id = child_env["CHUNLIAN_INSTANCE_ID"]

    def _spawn_workers(self, env: Mapping[str, str], cmd: list[str], host_name: str, threads: int | None) -> None:
        for i in range(1, self.spec.workers + 1):
            child_env = worker_env(self.spec, env, i, host_name, threads, self.local_url)
            self._spawn("worker", f"worker-{i}", cmd, child_env)

    def _spawn_nginx(self, binary: str, env: Mapping[str, str]) -> None:
        assert self.nginx_cfg is not None
        ng = self._spawn("nginx", "nginx", nginx_command(binary, self.nginx_cfg), env)
        ng.log_path = self.nginx_cfg.prefix / "logs" / "error.log"  # where nginx says why

    def _spawn_exporter(self, env: Mapping[str, str], avoid: list[int]) -> None:
        """``cluster.exporter`` following nginx's access log and reading its stub_status."""
        assert self.nginx_cfg is not None and self.spec.nginx_metrics_port is not None
        spec = self.spec
        port = spec.nginx_metrics_port or free_port(spec.instance_host, avoid=avoid)
        access_log = self.nginx_cfg.prefix / "logs" / "access.log" if spec.access_log else None
        cmd = exporter_command(f"{self.local_url}/nginx-status", f"{spec.instance_host}:{port}", access_log)
        child = self._spawn("exporter", "nginx-exporter", cmd, {**env, "PYTHONUNBUFFERED": "1"})
        child.port = port

    def _spawn(self, role: str, name: str, cmd: list[str], env: Mapping[str, str]) -> Child:
        assert self.prefix is not None
        child = spawn(role, name, cmd, env, self.prefix / "logs" / f"{name}.log")
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
