"""``chunlian cluster``: N instances + W workers + nginx on this machine, in the foreground.

    chunlian cluster --instances 2 --port 8000 --redis-url redis://127.0.0.1:6379/0

Ctrl-C or SIGTERM stops everything it started. ``--print-nginx-config --upstream H:P ...``
only renders the nginx config (for a front on another machine) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from chunlian.cliargs import hidden_alias


def _ports(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ports, got {text!r}") from None


def _print_config(args: argparse.Namespace) -> int:
    from chunlian.cluster.nginx import NginxConfig, front_deadline_s, render
    from chunlian.config import load_settings
    from chunlian.errors import ConfigError

    if not args.upstream:
        raise ConfigError("--print-nginx-config needs at least one --upstream HOST:PORT")
    settings = load_settings()  # the instances' (the environment's) limits and origins
    cfg = NginxConfig(
        upstreams=tuple(args.upstream),
        prefix=Path(args.prefix or "/var/lib/chunlian-nginx"),
        listen=f"{args.host}:{args.port}" if args.host else str(args.port),
        deadline_s=args.deadline_s or front_deadline_s(settings.default_timeout_ms),
        body_limit_bytes=settings.body_limit_bytes,
        cors_origins=settings.cors_origins,
        worker_processes=args.nginx_workers,
        **_rate_limit(args),
    )
    sys.stdout.write(render(cfg))
    return 0


def _rate_limit(args: argparse.Namespace) -> dict[str, Any]:
    """``NginxConfig``'s per-client rate limit fields (and the page cache's) from the flags."""
    return {"client_rate_per_s": args.client_rate, "client_burst": args.client_burst,
            "rate_limit_exempt": tuple(args.rate_limit_exempt), "trusted_proxies": tuple(args.trusted_proxy),
            "rate_limit_dry_run": args.client_rate_dry_run, "page_cache_s": args.page_cache_s}


def _summary(d: dict[str, Any], own_prefix: bool) -> str:
    lines = [f"chunlian cluster ready in {d['ready_s']} s: {d['url']}"]
    ng = d["nginx"]
    lines.append(f"  nginx       pid {ng['pid']:<7} {ng['url']}  (config {ng['config']})")
    if ng.get("client_rate_per_s"):
        dry = " (dry run: logged, not refused)" if ng.get("client_rate_dry_run") else ""
        lines.append(f"              per-client limit {ng['client_rate_per_s']:g} requests/s, burst {ng['client_burst']}{dry}")
    if ng.get("metrics_url"):
        lines.append(f"              its refusals and connections: {ng['metrics_url']}")
    for i, inst in enumerate(d["instances"], start=1):
        lines.append(f"  instance {i:<2} pid {inst['pid']:<7} {inst['url']}  id {inst['id']}")
    for i, w in enumerate(d["workers"], start=1):
        via = f"items via {w['engine_url']}" if w.get("engine_url") else "own model"
        lines.append(f"  worker {i:<4} pid {w['pid']:<7} (celery, {via}; log {w['log']})")
    if d.get("workers_note"):
        lines.append(f"  workers     none: {d['workers_note']}")
    lines.append(f"  redis       {d['redis_url']}")
    if d.get("broker_url"):
        lines.append(f"  broker      {d['broker_url']} (Celery)")
    lines.append(f"  logs        {d['prefix']}/logs" + (" (removed on exit; --prefix DIR keeps them)" if own_prefix else ""))
    lines.append("An instance, worker or exporter that exits is started again (--no-restart: left down).")
    lines.append("Ctrl-C (or SIGTERM) stops everything started here.")
    return "\n".join(lines)


def _cluster(args: argparse.Namespace) -> int:
    if args.print_nginx_config:
        return _print_config(args)
    from chunlian.cluster.launcher import DEFAULT_REDIS_URL, Cluster, ClusterSpec
    from chunlian.cluster.supervisor import Supervisor
    from chunlian.config import load_settings

    def say(msg: str) -> None:
        print(f"chunlian cluster: {msg}", file=sys.stderr, flush=True)

    spec = ClusterSpec(
        instances=args.instances,
        port=args.port,
        host=args.host or "127.0.0.1",
        workers=args.workers,
        redis_url=args.redis_url or load_settings().redis_url or DEFAULT_REDIS_URL,
        broker_url=args.broker_url,
        torch_threads=args.torch_threads,
        instance_ports=args.instance_ports or (),
        prefix=Path(args.prefix) if args.prefix else None,
        ready_timeout_s=args.ready_timeout_s,
        nginx=args.nginx,
        nginx_worker_processes=args.nginx_workers,
        deadline_s=args.deadline_s,
        worker_own_model=args.worker_own_model,
        nginx_options=_rate_limit(args),
        nginx_metrics_port=None if args.nginx_metrics_port < 0 else args.nginx_metrics_port,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    cluster = Cluster(spec, load_settings(environ={**os.environ, **spec.env}), say=say)
    say(f"starting {spec.instances} instance(s), {spec.workers} worker(s) and nginx on "
        f"{spec.host}:{spec.port} (waiting up to {spec.ready_timeout_s:.0f} s for readiness)")
    cluster.start(stop)  # raises ClusterError (stopping what it started) on failure
    rc = 0
    try:
        d = cluster.describe()
        print(json.dumps(d) if args.json else _summary(d, spec.prefix is None), flush=True)
        supervisor = None if args.no_restart else Supervisor(cluster, say=say)
        while not stop.wait(0.5):
            if supervisor is not None:
                supervisor.tick()
            else:
                for c in cluster.newly_exited():
                    left = sum(1 for i in cluster.instances if i.alive)
                    say(f"{c.name} (pid {c.pid}) exited with status {c.proc.returncode}; "
                        f"{left} of {len(cluster.instances)} instance(s) still serving")
            restarting = supervisor is not None and supervisor.pending_role("instance") > 0
            if not cluster.healthy() and not (restarting and cluster.nginx is not None and cluster.nginx.alive):
                say("nginx or every instance is gone: stopping everything")
                rc = 1
                break
    finally:
        say("stopping everything")
        cluster.stop()
        say("stopped")
    return rc


def register(sub: Any) -> None:
    """Add ``chunlian cluster`` to the main parser."""
    c = sub.add_parser(
        "cluster",
        help="N instances + W Celery workers + nginx on this machine, sharing one Redis",
        description="Start N service instances (each its own engine, all on one Redis), W Celery "
                    "workers and nginx in front (generated config in a temporary prefix; the "
                    "system nginx is never touched), wait until all are ready, print where each "
                    "runs, and stop everything on Ctrl-C or SIGTERM.",
    )
    c.add_argument("--instances", type=int, default=2, help="service instances (default 2)")
    c.add_argument("--port", type=int, default=8000, help="nginx's port (default 8000)")
    c.add_argument("--host", default=None, help="nginx's address (default 127.0.0.1)")
    c.add_argument("--workers", type=int, default=0,
                   help="Celery workers (default 0); they send their items through nginx to the "
                        "instances' engines at bulk priority and load no model")
    c.add_argument("--worker-own-model", action="store_true",
                   help="workers load their own model instead (they then compete with the "
                        "instances for this machine's cores outside any scheduler; docs/guides/bulk-jobs.md)")
    c.add_argument("--redis-url", default=None,
                   help="the shared Redis (default $CHUNLIAN_REDIS_URL or redis://127.0.0.1:6379/0)")
    c.add_argument("--broker-url", default=None,
                   help="Celery's broker (default $CHUNLIAN_BROKER_URL, else --redis-url when --workers > 0)")
    c.add_argument("--torch-threads", type=int, default=None,
                   help="torch threads per instance (default: cores // instances)")
    c.add_argument("--instance-ports", type=_ports, default=None,
                   help="comma-separated ports for the instances (default: free ports)")
    c.add_argument("--prefix", default=None,
                   help="directory for nginx's config, pid, temp files and every log (kept); "
                        "default: a temporary one, removed on exit")
    c.add_argument("--ready-timeout-s", type=float, default=120.0,
                   help="seconds to wait for readiness (default 120)")
    hidden_alias(c, "--ready-timeout", "ready_timeout_s", type=float)
    c.add_argument("--deadline-s", type=float, default=None,
                   help="longest request deadline allowed through nginx (default max(30, service default))")
    c.add_argument("--nginx", default=None, help="the nginx binary (default: on PATH or /usr/sbin/nginx)")
    c.add_argument("--nginx-workers", default="auto", help="nginx worker_processes (default auto)")
    c.add_argument("--client-rate", type=float, default=0.0, metavar="R",
                   help="per-client limit on /v1/couplets and /v1/jobs, requests a second per address "
                        "(default 0: off; fractions allowed, e.g. 0.5); above it nginx answers 429 "
                        "with Retry-After (deploy/nginx/README.md)")
    c.add_argument("--client-burst", type=int, default=20, metavar="N",
                   help="requests above --client-rate let through at once (default 20)")
    c.add_argument("--client-rate-dry-run", action="store_true",
                   help="refuse nothing: log what --client-rate would refuse (access log limit=REJECTED_DRY_RUN)")
    c.add_argument("--rate-limit-exempt", action="append", default=[], metavar="CIDR",
                   help="an address or CIDR never rate limited (repeat)")
    c.add_argument("--trusted-proxy", action="append", default=[], metavar="CIDR",
                   help="a proxy or CDN address/CIDR whose X-Forwarded-For names the client (repeat)")
    c.add_argument("--page-cache-s", type=int, default=60, metavar="S",
                   help="seconds nginx (and browsers) keep the campaign page and its files (default 60; "
                        "0: every visitor's requests reach an instance)")
    c.add_argument("--nginx-metrics-port", type=int, default=9113, metavar="PORT",
                   help="where nginx's own counters are served for Prometheus (its 429s, 413s, 503s and "
                        "connections: chunlian.cluster.exporter; default 9113, 0: a free port, -1: none)")
    c.add_argument("--no-restart", action="store_true",
                   help="leave an instance, worker or exporter that exits down (default: start it again, "
                        "waiting 1, 2, 4 ... s; a sixth exit within 5 min leaves it down)")
    c.add_argument("--json", action="store_true", help="print the ready cluster as one JSON line")
    c.add_argument("--print-nginx-config", action="store_true",
                   help="only print the rendered nginx config for --upstream HOST:PORT ... and exit")
    c.add_argument("--upstream", action="append", default=[], metavar="HOST:PORT",
                   help="an instance address (repeat; with --print-nginx-config)")
    c.set_defaults(fn=_cluster)
