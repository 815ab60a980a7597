"""Answers right after ``chunlian cluster`` says it is ready: how many are not 200.

Starts ``chunlian cluster --instances 2`` as an operator would (the console command, its own
process), reads its stdout until the "ready in" line, then at once sends ``--requests``
sequential ``POST /v1/couplets`` through nginx (new connection each, as separate clients
would) and counts the statuses; nginx's error log is read for ``no live upstreams`` before
the cluster is stopped. Repeated ``--rounds`` times.

Meanwhile, from the launch until "ready", an outside readiness probe (a load balancer's
health check, an uptime monitor) polls ``GET /readyz`` through nginx every 0.1 s, as one
would in production (``--no-probe``: none).

    python benchmarks/startup_503.py --rounds 3 --requests 200 [--out runs/startup_503.json]

Redis db 13 on 127.0.0.1 holds the shared cache; it is flushed before every round so the
first answers are generated, not read from a previous round's cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from chunlian.cluster.procs import free_port, http_status

REDIS_URL = "redis://127.0.0.1:6379/13"
UPPERS = ("春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海",
          "瑞雪纷飞兆丰年", "东风送暖入屠苏", "红梅报喜迎新岁")


def _flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS_URL, socket_timeout=5).flushdb()


class _Prober(threading.Thread):
    """An outside readiness probe through nginx (a load balancer's or an uptime check's):
    ``GET /readyz`` every 0.1 s from the launch until the cluster says it is ready."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.statuses[http_status("127.0.0.1", self.port, "/readyz", timeout=1.0) or 0] += 1


def _round(requests: int, ready_timeout_s: float, probe: bool) -> dict[str, Any]:
    _flush_redis()
    port = free_port()
    prefix = Path(tempfile.mkdtemp(prefix="chunlian-startup-"))
    os.chmod(prefix, 0o711)
    cmd = [sys.executable, "-m", "chunlian.cli", "cluster", "--instances", "2", "--port", str(port),
           "--redis-url", REDIS_URL, "--prefix", str(prefix), "--nginx-metrics-port", "-1",
           "--ready-timeout-s", str(ready_timeout_s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    prober = _Prober(port)
    if probe:
        prober.start()
    try:
        assert proc.stdout is not None
        ready_line = ""
        for line in proc.stdout:
            if "ready in" in line:
                ready_line = line.strip()
                break
        prober.stop.set()
        if not ready_line:
            raise RuntimeError(f"chunlian cluster exited with {proc.wait()} before it was ready")
        statuses: Counter[int] = Counter()
        first_bad: int | None = None
        t0 = time.monotonic()
        with httpx.Client(timeout=60.0) as client:
            for k in range(requests):
                r = client.post(f"http://127.0.0.1:{port}/v1/couplets",
                                json={"upper": UPPERS[k % len(UPPERS)]}, headers={"Connection": "close"})
                statuses[r.status_code] += 1
                if r.status_code != 200 and first_bad is None:
                    first_bad = k
        elapsed = time.monotonic() - t0
        error_log = (prefix / "nginx" / "logs" / "error.log").read_text(errors="replace")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(prefix, ignore_errors=True)
    return {"ready": ready_line, "requests": requests, "statuses": dict(statuses),
            "non_200": requests - statuses[200], "first_non_200_at": first_bad,
            "seconds": round(elapsed, 2),
            "probe_statuses_during_startup": dict(prober.statuses),
            "no_live_upstreams_lines": error_log.count("no live upstreams"),
            "upstream_errors_logged": error_log.count("connect() failed")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--ready-timeout-s", type=float, default=180.0)
    ap.add_argument("--no-probe", action="store_true",
                    help="no outside readiness probe through nginx during start-up")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rounds = []
    for n in range(1, args.rounds + 1):
        res = _round(args.requests, args.ready_timeout_s, not args.no_probe)
        rounds.append(res)
        print(f"round {n}: {res['non_200']} of {res['requests']} not 200 {res['statuses']} "
              f"(first at #{res['first_non_200_at']}; 'no live upstreams' x{res['no_live_upstreams_lines']}); "
              f"{res['ready']}", flush=True)
    report = {"when_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "cpus": os.cpu_count(),
              "rounds": rounds, "non_200_total": sum(r["non_200"] for r in rounds),
              "requests_total": sum(r["requests"] for r in rounds)}
    print(f"total: {report['non_200_total']} of {report['requests_total']} not 200")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
