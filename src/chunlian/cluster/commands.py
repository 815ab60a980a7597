"""What each child of ``chunlian cluster`` runs, and with which environment: the worker's
and the nginx exporter's commands, and the OpenMP spin of model-running processes."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

WORKER_READY = " ready."  # Celery's log line once a worker consumes ("celery@host ready.")


def worker_command() -> list[str]:
    """The command that runs one Celery worker (``chunlian worker``)."""
    return [sys.executable, "-m", "chunlian.cli", "worker", "--log-level", "INFO"]


def exporter_command(status_url: str, listen: str, access_log: Path | None) -> list[str]:
    """The command that runs the nginx exporter (``cluster.exporter``): nginx's stub_status
    at ``status_url``, and its access log when it keeps one."""
    cmd = [sys.executable, "-m", "chunlian.cluster.exporter", "--status-url", status_url, "--listen", listen]
    if access_log is not None:
        cmd += ["--access-log", str(access_log)]
    return cmd


def spin_env(env: Mapping[str, str], instances: int, workers: int) -> dict[str, str]:
    """The instances' OpenMP spin (``chunlian.omp``): bounded when several model-running
    processes share this machine's cores, unless ``CHUNLIAN_OMP_SPIN`` says otherwise; a
    lone instance keeps the full spin of ``chunlian serve``."""
    if env.get("CHUNLIAN_OMP_SPIN") or (instances < 2 and workers < 1):
        return {}
    return {"CHUNLIAN_OMP_SPIN": "bounded"}
