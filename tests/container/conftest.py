"""Shared by the container tests: where the repository is, the image (built once a run), and the
one line the test run prints when this machine's container runtime cannot start a container (the
tests that run containers are then skipped, never silently passed)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/chunlian-base:bookworm"
IMAGE = "localhost/chunlian:test"
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
            f"CONTAINER RUNTIME CANNOT START CONTAINERS HERE: {reason} -- the tests that run containers did not run",
            red=True, bold=True)


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The project's image, built by scripts/build-image.sh (layers cached between runs); the
    test is skipped, with the run's closing line saying why, when podman cannot start containers."""
    t0 = time.monotonic()
    build = subprocess.run([str(ROOT / "scripts" / "build-image.sh"), IMAGE], cwd=ROOT, capture_output=True,
                           text=True, timeout=1200, check=False)
    problem = runtime_problem()  # after the build: it installs podman and makes the base image
    if problem is not None:
        note_runtime_problem(problem)
        pytest.skip(f"the container runtime cannot start containers here: {problem}")
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    print(f"\nimage built (or found cached) in {time.monotonic() - t0:.1f} s")
    yield IMAGE
