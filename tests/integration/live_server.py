"""A real uvicorn server for integration tests: in a thread, on a socket bound to a free
loopback port, serving ``create_app`` around the real ``Engine``; plus a model file.

The shipped weights are used when present; without them (a fresh checkout before the
model is trained) a small randomly initialised model of the same class is written, so the
real loader, runner, rules and engine still run end to end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from chunlian.api import create_app
from chunlian.cluster.nginx import NginxConfig
from chunlian.config import DEFAULT_WARMUP, Settings
from chunlian.engine.client import EngineClient
from chunlian.model.checkpoint import DEFAULT_WEIGHTS

# Characters every test input uses, besides the 横批 list and the style lexicons.
_TEST_TEXT = "".join(DEFAULT_WARMUP) + (
    "春回大地千山秀福满人间万户新天增岁月人增寿爆竹声声辞旧岁梅花点点迎新春一帆风顺年年好"
    "万事如意步步高生意兴隆通四海财源茂盛达三江李明张伟王芳家和国泰民安喜庆瑞雪丰收东风送暖"
    "红日照门庭绿水青山好春光碧海蓝天花开富贵竹报平安金玉满堂五谷丰登六畜兴旺鸟语花香"
)


def model_path(tmp_dir: Path) -> Path:
    """The shipped weights, or a small random model of the same class written to ``tmp_dir``."""
    if DEFAULT_WEIGHTS.is_file():
        return DEFAULT_WEIGHTS
    import torch

    from chunlian.model.checkpoint import save_weights
    from chunlian.model.styles import LEXICONS
    from chunlian.model.tokenizer import SPECIALS, Tokenizer
    from chunlian.model.transformer import CoupletTransformer, ModelConfig
    from chunlian.text import is_han

    hengpi = resources.files("chunlian").joinpath("resources", "hengpi.tsv").read_text(encoding="utf-8")
    text = hengpi + "".join(LEXICONS.values()) + _TEST_TEXT
    chars = sorted({ch for ch in text if is_han(ch)} | set("，、；：！？。"))
    tok = Tokenizer(list(SPECIALS) + chars)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), n_layer=2, n_head=4, d_model=64, d_ff=128)
    path = tmp_dir / "tiny-couplet.safetensors"
    save_weights(path, CoupletTransformer(cfg), tok, version="tiny-test")
    return path


def nginx_or_skip() -> str:
    """The nginx binary; a skip without it (a failure under CI, which installs it)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        msg = "nginx is not installed (bash scripts/install-nginx.sh)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def free_socket() -> socket.socket:
    """A listening-ready socket bound to a free loopback port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LiveServer:
    """``create_app(settings, engine)`` under uvicorn in a background thread."""

    def __init__(self, settings: Settings, engine: EngineClient | None = None) -> None:
        self.app = create_app(settings, engine=engine)
        self.runtime = self.app.state.runtime
        self._sock = free_socket()
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="live-uvicorn", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as e:  # surfaced by start()
            self.error = e

    def start(self, limit_s: float = 120.0) -> LiveServer:
        """Start and wait until uvicorn accepts connections (not until ready)."""
        self._thread.start()
        deadline = time.monotonic() + limit_s
        while not self.server.started:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in time")
            time.sleep(0.05)
        return self

    def wait_ready(self, limit_s: float = 180.0) -> None:
        """Poll /readyz until it says 200 (bounded)."""
        deadline = time.monotonic() + limit_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while client.get("/readyz").status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("service did not become ready in time")
                time.sleep(0.1)

    def stop(self) -> None:
        """Graceful shutdown (lifespan shutdown runs: the engine stops)."""
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


@contextmanager
def serving(settings: Settings, engine: EngineClient | None = None) -> Iterator[LiveServer]:
    """A started server, once it is ready; stopped on the way out, whatever happened."""
    server = LiveServer(settings, engine).start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@dataclass
class Front:
    """A started nginx (``nginx_front``): its URL, access log and config."""

    url: str
    access_log: Path
    cfg: NginxConfig

    def limit_states(self, at_least: int = 0, wait_s: float = 5.0) -> list[str]:
        """``$limit_req_status`` of every couplet request in the access log, in order. nginx
        writes a request's line after sending its response, so a caller that knows how many
        requests it made waits (up to ``wait_s``) for ``at_least`` lines."""
        deadline = time.monotonic() + wait_s
        while True:
            lines = self.access_log.read_text().splitlines()
            states = [line.rsplit("limit=", 1)[1] for line in lines if "/v1/couplets" in line]
            if len(states) >= at_least or time.monotonic() >= deadline:
                return states
            time.sleep(0.05)


@contextmanager
def nginx_front(prefix: Path, upstream_ports: list[int], **options: Any) -> Iterator[Front]:
    """A real nginx with the rendered config (``NginxConfig(**options)``, one worker) in front
    of ``upstream_ports`` on loopback, answering ``/nginx-health``; stopped (and its files
    removed) on the way out. Its stdout goes to ``prefix``/nginx.out."""
    import tempfile

    from chunlian.cluster.nginx import check_config, nginx_command, write
    from chunlian.cluster.procs import free_port, http_status

    binary = nginx_or_skip()
    port = free_port()
    # nginx's own files in a fresh directory under /tmp: as root its workers run as nobody,
    # who cannot pass through pytest's 0700 temporary directories to reach the page cache
    home = Path(tempfile.mkdtemp(prefix="chunlian-nginx-test-"))
    home.chmod(0o711)
    cfg = NginxConfig(upstreams=tuple(f"127.0.0.1:{p}" for p in upstream_ports), prefix=home / "nginx",
                      listen=f"127.0.0.1:{port}", worker_processes="1", **options)
    write(cfg)
    check_config(binary, cfg)
    log = (prefix / "nginx.out").open("w")
    proc = subprocess.Popen(nginx_command(binary, cfg), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while http_status("127.0.0.1", port, "/nginx-health") != 200:
            assert proc.poll() is None, (cfg.prefix / "logs" / "error.log").read_text()
            assert time.monotonic() < deadline, "nginx did not answer /nginx-health in 30 s"
            time.sleep(0.05)
        yield Front(f"http://127.0.0.1:{port}", cfg.prefix / "logs" / "access.log", cfg)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def exporter_running(front: Front, poll_s: float = 0.1) -> Iterator[str]:
    """``chunlian.cluster.exporter`` following ``front``'s access log and stub_status, in a
    thread, once its /metrics answers; yields that URL; stopped on the way out."""
    from chunlian.cluster.exporter import run
    from chunlian.cluster.procs import free_port, http_status

    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=run, daemon=True, args=(
        front.access_log, f"{front.url}/nginx-status", "127.0.0.1", port, poll_s, stop))
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while http_status("127.0.0.1", port, "/metrics") != 200:
            assert thread.is_alive() and time.monotonic() < deadline, "the exporter never answered"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        stop.set()
        thread.join(10)
