"""Shared by the container tests: where the repository is, and the one line the test run prints
when this machine's container runtime cannot start a container (the smoke test is then skipped,
never silently passed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/chunlian-base:bookworm"
RUNTIME_PROBLEMS: list[str] = []


def runtime_problem() -> str | None:
    """Why podman cannot start a container here (None: it can). Needs the base image."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/install-containers.sh)"
    probe = subprocess.run(["podman", "run", "--rm", "--network", "host", BASE_IMAGE, "true"],
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        return lines[-1] if lines else f"podman run exited with {probe.returncode}"
    return None


def note_runtime_problem(reason: str) -> None:
    RUNTIME_PROBLEMS.append(reason)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for reason in RUNTIME_PROBLEMS:
        terminalreporter.write_line(
            f"CONTAINER RUNTIME CANNOT START CONTAINERS HERE: {reason} -- the image smoke test did not run",
            red=True, bold=True)
