"""Fixtures for the browser tests: a real chunlian server and Debian's headless Chromium.

The browser is ``/usr/bin/chromium`` from Debian (``scripts/install-browser.sh`` installs it);
Playwright only drives it and never downloads one. Without Chromium the tests skip, except
under ``CI=true`` where they fail and say how to install it.

``CHUNLIAN_E2E_URL=http://host:port`` points the tests at a server that is already running
instead of starting ``python -m chunlian.api``; ``CHUNLIAN_E2E_READY_TIMEOUT`` (seconds, 120)
bounds the wait for ``GET /readyz``; the server's log is copied to ``out/e2e/server.log``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("CHUNLIAN_E2E_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY_TIMEOUT_S = float(os.environ.get("CHUNLIAN_E2E_READY_TIMEOUT", "120"))
OUT_DIR = REPO / "out" / "e2e"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI=true, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def out_dir() -> Path:
    """``out/e2e`` in the repository root (git-ignored): the screenshots to look at."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUT_DIR


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (with a trailing slash) of a ready chunlian server."""
    given = os.environ.get("CHUNLIAN_E2E_URL")
    if given:
        base = given.rstrip("/") + "/"
        if _get_status(base + "readyz") != 200:
            pytest.fail(f"CHUNLIAN_E2E_URL={given} is not ready (GET /readyz != 200)")
        yield base
        return

    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = dict(os.environ)
    env.update(
        CHUNLIAN_HOST="127.0.0.1",
        CHUNLIAN_PORT=str(port),
        # No warm-up list: ready as soon as the model is loaded. CHUNLIAN_E2E_WARMUP overrides.
        CHUNLIAN_WARMUP=os.environ.get("CHUNLIAN_E2E_WARMUP", ""),
        CHUNLIAN_TORCH_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chunlian.api"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"`python -m chunlian.api` exited with {proc.returncode} before it was ready; "
                    f"log tail:\n{_tail(log_path)}",
                    pytrace=False,
                )
            if _get_status(base + "readyz") == 200:
                break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"server on port {port} not ready after {READY_TIMEOUT_S:.0f} s; "
                    f"log tail:\n{_tail(log_path)}",
                    pytrace=False,
                )
            time.sleep(0.5)
        yield base
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, OUT_DIR / "server.log")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (no browser download).

    Module scope: Playwright's sync API runs an event loop in the main thread while it is
    open, which would break every asyncio test collected after the e2e module."""
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} not found: run scripts/install-browser.sh (Debian chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
