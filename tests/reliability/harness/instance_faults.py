"""Scenario 4: one of two instances behind nginx killed under load (package docstring).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.reliability.harness.common import (
    CLUSTER_REDIS_DB,
    HOST,
    HOT_LINES,
    REDIS_PORT,
    Outcome,
    upper_lines,
)
from tests.reliability.harness.worker_faults import cluster_available

# ---- 4. instance faults ------------------------------------------------------------------------------



async def instance_fault(*, clients: int = 8, duration_s: float = 30.0, kill_after_s: float = 8.0,
                         model_path: str | Path | None = None) -> Outcome:
    """Two instances behind nginx (``chunlian.cluster``); clients send idempotent requests
    (seeded couplets: fresh work for the engines) for ``duration_s``; one instance is
    SIGKILLed once it has answered some and ``kill_after_s`` passed. No request may fail."""
    out = Outcome("4. instance killed behind nginx", f"2 instances + nginx, {clients} clients for {duration_s:.0f} s, "
                  "one instance SIGKILLed")
    why = cluster_available()
    if why:
        out.skipped = why
        return out
    from chunlian.cluster.launcher import Cluster, ClusterSpec
    from chunlian.cluster.procs import free_port as cluster_free_port
    from chunlian.config import load_settings

    env = {"CHUNLIAN_CACHE_SIZE": "0", "CHUNLIAN_WARMUP": "", "CHUNLIAN_DEVICE": "cpu",
                "CHUNLIAN_LOG_LEVEL": "WARNING", "CHUNLIAN_MAX_BATCH_SIZE": "16"}
    if model_path:
        env["CHUNLIAN_MODEL_PATH"] = str(model_path)
    prefix = Path(tempfile.mkdtemp(prefix="chunlian-rel-cluster-"))
    spec = ClusterSpec(instances=2, port=cluster_free_port(), workers=0,
                       redis_url=f"redis://{HOST}:{REDIS_PORT}/{CLUSTER_REDIS_DB}", torch_threads=1,
                       nginx_worker_processes="1", env=env, ready_timeout_s=240, access_log=False,
                       prefix=prefix)
    try:
        cluster = await asyncio.to_thread(lambda: Cluster(spec, load_settings(environ={**os.environ, **spec.env})).start())
    except BaseException:
        shutil.rmtree(prefix, ignore_errors=True)
        raise
    t0 = time.monotonic()
    try:
        victim, survivor = cluster.instances[0], cluster.instances[1]
        served: Counter[str] = Counter()
        killed_at: list[float] = []
        rng = random.Random(4)
        lines = upper_lines()
        end = t0 + duration_s

        async def client() -> None:
            async with httpx.AsyncClient(base_url=cluster.url, timeout=90) as c:
                while time.monotonic() < end:
                    body = {"upper": rng.choice(lines), "seed": rng.randrange(1 << 40)}
                    after = bool(killed_at)
                    try:
                        r = await c.post("/v1/couplets", json=body)
                    except httpx.HTTPError as e:
                        out.count("failed", f"transport:{type(e).__name__}")
                        out.problem(f"transport error {'after' if after else 'before'} the kill: {e!r}")
                        continue
                    inst = r.headers.get("x-chunlian-instance", "?")
                    served[inst] += 1
                    if r.status_code == 200:
                        out.count("answered", "200")
                    elif r.status_code == 429:
                        out.count("rejected", "429")
                    else:
                        out.count("failed", str(r.status_code))
                        out.problem(f"{r.status_code} from {inst} {'after' if after else 'before'} the kill: {r.text[:160]}")

        async def killer() -> None:
            while time.monotonic() < end:
                if time.monotonic() - t0 >= kill_after_s and served[victim.instance_id or ""] >= 3:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed_at.append(time.monotonic() - t0)
                    return
                await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(clients)), killer())
        if not killed_at:
            out.problem("the victim never served 3 requests: it was not killed")
        out.note(f"answers by instance {dict(served)}; victim killed at {killed_at[0] if killed_at else float('nan'):.1f} s")
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as c:
            r = await c.post("/v1/couplets", json={"upper": HOT_LINES[0], "seed": 7})
        if r.status_code != 200 or r.headers.get("x-chunlian-instance") != survivor.instance_id:
            out.problem(f"after the kill: {r.status_code} from {r.headers.get('x-chunlian-instance')}")
    finally:
        await asyncio.to_thread(cluster.stop)
        out.seconds = time.monotonic() - t0
        if out.failed:  # say why, from the instances' own logs
            for log in sorted((prefix / "logs").glob("instance-*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    tb = text[text.rindex("Traceback"):].strip().splitlines()
                    out.note(f"{log.name}: " + " | ".join(tb[-6:])[:1200])
        shutil.rmtree(prefix, ignore_errors=True)
    return out
