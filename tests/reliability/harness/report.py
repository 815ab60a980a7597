"""The long run: every scenario within one time budget, and its report (``runs/reliability.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import platform
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.reliability.harness.bad_input import bad_input
from tests.reliability.harness.client_faults import disconnects, queued_deadlines, slow_clients
from tests.reliability.harness.common import (
    CLUSTER_REDIS_DB,
    HOST,
    REDIS_PORT,
    SECURITY_REDIS_DB,
    Outcome,
    raise_fd_limit,
)
from tests.reliability.harness.instance_faults import instance_fault
from tests.reliability.harness.overload import overload
from tests.reliability.harness.redis_fault import redis_fault
from tests.reliability.harness.security import security
from tests.reliability.harness.services import (
    InProcessService,
    ServiceProcess,
    flush_db,
    redis_pings,
    start_redis,
)
from tests.reliability.harness.worker_faults import worker_fault

# ---- the long run and its report ----------------------------------------------------------------

TOTAL_BUDGET_S = 600.0
API_KEYS = ("rel-key-alpha-7f3a9c", "rel-key-beta-2b8e41")
DOC_PATH = Path("runs/reliability.md")  # git-ignored: a run never rewrites the docs


def main_service_settings(queue: str) -> dict[str, object]:
    """The service that bad input, security and Redis faults run against: Redis (db 12) as
    its only cache, API keys, INFO logs, and Celery jobs with no worker (a fuzzed job is
    queued, never run, so it cannot load the engine)."""
    db_url = f"redis://{HOST}:{REDIS_PORT}/{SECURITY_REDIS_DB}"
    return {"redis_url": db_url, "broker_url": db_url, "job_queue": queue, "cache_size": 0,
            "cache_ttl_s": 3600, "job_result_ttl_s": 600,  # what this leaves in db 12 expires
            "api_keys": ",".join(API_KEYS), "log_level": "INFO", "max_queue_size": 32}


def drop_queue(queue: str, db: int = SECURITY_REDIS_DB) -> None:
    """Delete a Celery queue this suite made (its list and kombu's binding), nothing else."""
    import redis

    r = redis.Redis(host=HOST, port=REDIS_PORT, db=db, socket_timeout=5)
    try:
        r.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    finally:
        r.close()


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    load = ""
    with contextlib.suppress(OSError):
        load = ", load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    try:
        import torch

        torch_v = f", torch {torch.__version__}"
    except ImportError:
        torch_v = ""
    return (f"{platform.node()} ({cpu or platform.machine()}, {os.cpu_count()} cores{mem}; "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}{torch_v}{load} at start)")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return head + (" with uncommitted changes" if dirty else "") if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cell(o: Outcome, name: str) -> str:
    if o.skipped:
        return "-"
    return str(getattr(o, name))


def _result(o: Outcome) -> str:
    if o.skipped:
        return f"skipped: {o.skipped}"
    return "pass" if o.ok else "**FAIL**"


def render_report(outcomes: list[Outcome], started: dt.datetime, wall_s: float, model: str, scale: str,
                  code: str | None = None) -> str:
    """The Markdown report; ``code``: the commit the run started from (``git_commit()`` then:
    taken at the end, the run's own partial reports would make every tree look changed)."""
    lines = [
        "# Reliability run: overload, faults and hostile input",
        "",
        "Written by `scripts/reliability.sh` (`python -m tests.reliability.harness`), which runs the",
        "long scenarios against real processes over loopback; the short versions run in CI",
        "(`pytest tests/reliability -m \"not slow\"`). Every loop is bounded in count and time; the",
        "whole run is bounded to 10 minutes.",
        "",
        f"* **Run:** {started:%Y-%m-%d %H:%M} UTC, {wall_s / 60:.1f} min ({scale} scale); load average "
        f"at the end {_loadavg()} (the machine is shared: other processes' load shows in the latencies)",
        f"* **Machine:** {machine()}",
        f"* **Code:** commit {code or git_commit()}; model `{model}`",
        "",
        "| scenario | load applied | sent | answered | rejected | failed | items lost | result |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.scenario} | {o.load} | {_cell(o, 'sent')} | {_cell(o, 'answered')} | "
                     f"{_cell(o, 'rejected')} | {_cell(o, 'failed')} | {_cell(o, 'lost')} | {_result(o)} |")
    lines += [
        "",
        "*answered*: 2xx. *rejected*: a refusal the scenario allows and the client can act on: 429 with",
        "`Retry-After`, 504 `deadline_exceeded` once the request's deadline passed, a 4xx in the error",
        "shape `{\"error\": {\"code\", \"message\", \"field\"}}`, or 499 for a client that had gone. *failed*: a 5xx",
        "other than 504, no answer, or an answer that broke a promise (wrong shape, a stack trace or an",
        "internal path in the body, a 200 after its deadline). *items lost*: requests that never got any",
        "answer, or job items missing or duplicated in the job's results.",
        "",
        "## Details",
        "",
    ]
    for o in outcomes:
        lines.append(f"### {o.scenario}")
        lines.append("")
        if o.skipped:
            lines += [f"Skipped: {o.skipped}.", ""]
            continue
        statuses = ", ".join(f"{k} x{v}" for k, v in sorted(o.statuses.items()))
        lines.append(f"{o.load}; {o.seconds:.0f} s." + (f" Statuses: {statuses}." if statuses else ""))
        lines.append("")
        for n in o.notes:
            lines.append(f"* {n}")
        for p in o.problems:
            lines.append(f"* **problem:** {p}")
        lines.append("")
    lines += [
        "## Known and accepted behaviour",
        "",
        "* Bytes that are not HTTP/1.1 at all (a TLS hello, a header line without a colon, two",
        "  `Content-Length`s, `Content-Length` with `Transfer-Encoding`) are refused by uvicorn's parser",
        "  with a plain-text `400 Invalid HTTP request received.` before the app runs, so that answer",
        "  cannot carry the JSON error shape. It never carries internals either.",
        "* A deadline the client chose (`timeout_ms`, at least 10 ms) that passes gives",
        "  `504 deadline_exceeded`; it is documented in the OpenAPI and counted as *rejected*.",
        "* schemathesis `--checks all` flags, by design: schema-valid text that breaks the line rules",
        "  (Chinese only, at most 32 characters) answered 422; bodies over the 1 MB limit answered 413",
        "  (and 413/431 not listed per operation); a bad batch item answered with an error result",
        "  inside the batch's 200. Every other check failure counts as a problem above.",
        "",
    ]
    return "\n".join(lines)


SCALES: dict[str, dict[str, Any]] = {
    "long": {
        "overload": {"connections": 2000, "duration_s": 60.0, "warmup_s": 20.0, "timeout_ms": 3000},
        "redis": {"clients": 16, "before_s": 10.0, "outage_s": 10.0, "after_s": 10.0},
        "client": {"queued": 16, "slow": 200, "normal": 40},
        "bad": {"hypothesis_examples": 500, "schemathesis_examples": 150, "schemathesis_time_s": 240.0},
        "cluster": {"clients": 16, "duration_s": 30.0, "kill_after_s": 10.0},
        "jobs": {"items": 2000},
    },
    "quick": {  # a smoke run of the runner itself (a few minutes)
        "overload": {"connections": 300, "duration_s": 5.0, "warmup_s": 3.0, "timeout_ms": 3000},
        "redis": {"clients": 8},
        "client": {"queued": 8, "slow": 40, "normal": 10},
        "bad": {"hypothesis_examples": 100, "schemathesis_examples": 10, "schemathesis_time_s": 120.0},
        "cluster": {"clients": 8, "duration_s": 15.0, "kill_after_s": 5.0},
        "jobs": {"items": 200},
    },
}


class _Outcomes(list[Outcome]):
    """The outcomes so far; ``on_change`` runs after each one is added (the report is
    rewritten after every scenario, so an interrupted run still leaves its table)."""

    def __init__(self, on_change: Callable[[list[Outcome]], None] | None) -> None:
        super().__init__()
        self.on_change = on_change

    def append(self, o: Outcome) -> None:
        super().append(o)
        if self.on_change is not None:
            self.on_change(list(self))



async def run_all(scale: str = "long", budget_s: float = TOTAL_BUDGET_S, only: Sequence[str] = (),
                  model_path: str | None = None, say: Callable[[str], None] = print,
                  on_change: Callable[[list[Outcome]], None] | None = None) -> tuple[list[Outcome], str]:
    """Every scenario at ``scale`` within ``budget_s`` (a scenario that would start with too
    little time left is reported as not run). Returns the outcomes and the model tag."""
    cfg = SCALES[scale]
    t_end = time.monotonic() + budget_s
    outcomes: list[Outcome] = _Outcomes(on_change)
    model = "unknown"
    want = set(only) or {"security", "bad", "client", "overload", "redis", "cluster", "jobs"}
    base: dict[str, object] = {"model_path": model_path} if model_path else {}

    def left() -> float:
        return t_end - time.monotonic()

    def not_run(name: str, need: float) -> bool:
        if left() < need:
            o = Outcome(name)
            o.skipped = f"not run: {left():.0f} s of the {budget_s:.0f} s budget left, it needs about {need:.0f} s"
            outcomes.append(o)
            say(o.skipped)
            return True
        return False

    raise_fd_limit(cfg["overload"]["connections"] + 1024)
    if not redis_pings():
        await asyncio.to_thread(start_redis)
    queue = f"chunlian-rel-{uuid.uuid4().hex[:8]}"
    if want & {"security", "bad", "redis", "client"}:
        say("starting the main service (Redis cache db 12, API keys, INFO logs)")
        main_svc = await asyncio.to_thread(lambda: ServiceProcess({**base, **main_service_settings(queue)}, "main").start())
        try:
            model = httpx.get(main_svc.url + "/healthz", timeout=30).json().get("model") or model
            if "security" in want:
                say("7. security basics")
                outcomes.append(await asyncio.wait_for(
                    security(main_svc, api_keys=API_KEYS, redis_db=SECURITY_REDIS_DB), max(30.0, left())))
            if "bad" in want and not not_run("6. bad input", 60):
                say("6. bad input")
                b = dict(cfg["bad"])
                b["schemathesis_time_s"] = min(b["schemathesis_time_s"], max(30.0, left() - 400))
                outcomes.append(await asyncio.wait_for(bad_input(main_svc.url, api_key=API_KEYS[0], **b), left()))
            if "client" in want and not not_run("5. client faults", 45):
                say("5. client faults")
                c = cfg["client"]
                held = await asyncio.to_thread(
                    lambda: InProcessService({**base, "max_batch_size": 1, "max_queue_size": 64}).start())
                try:
                    o5 = Outcome("5. client faults", "")
                    parts = [await disconnects(held, queued=c["queued"]),
                             await queued_deadlines(held, queued=c["queued"]),
                             await slow_clients(main_svc.url, slow=c["slow"], normal=c["normal"])]
                    for p in parts:
                        o5.merge(p)
                        o5.seconds += p.seconds
                    o5.load = "; ".join(p.load for p in parts)
                    outcomes.append(o5)
                finally:
                    await asyncio.to_thread(held.stop)
            if "redis" in want and not not_run("2. Redis stopped and restarted", 60):
                say("2. Redis stopped and restarted")
                outcomes.append(await redis_fault(main_svc.url, **cfg["redis"]))
        finally:
            await asyncio.to_thread(main_svc.cleanup)
            with contextlib.suppress(Exception):
                drop_queue(queue)
    if "overload" in want and not not_run("1. overload", cfg["overload"]["duration_s"] + cfg["overload"]["warmup_s"] + 60):
        say("1. overload")
        svc = await asyncio.to_thread(lambda: ServiceProcess({**base, "max_queue_size": 32}, "overload").start())
        try:
            ov = cfg["overload"]
            outcomes.append(await overload(svc.url, svc.pid, **ov, strict_latency=True))
        finally:
            await asyncio.to_thread(svc.cleanup)
    if "cluster" in want and not not_run("4. instance killed behind nginx", cfg["cluster"]["duration_s"] + 60):
        say("4. instance killed behind nginx")
        flush_db(CLUSTER_REDIS_DB)
        outcomes.append(await instance_fault(**cfg["cluster"], model_path=model_path))
        flush_db(CLUSTER_REDIS_DB)
    if "jobs" in want and not not_run("3. worker faults", 150):
        say("3. worker faults")
        limit = max(60.0, (left() - 60) / 2)
        for o3 in await asyncio.to_thread(lambda: worker_fault(items=cfg["jobs"]["items"], job_limit_s=limit,
                                                                 model_path=model_path)):
            outcomes.append(o3)
    return sort_outcomes(outcomes), model


def sort_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    order = {n: i for i, n in enumerate(["1.", "2.", "3a", "3b", "3.", "4.", "5.", "6.", "7."])}
    return sorted(outcomes, key=lambda o: next((v for k, v in order.items() if o.scenario.startswith(k)), 99))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.reliability.harness",
                                 description="Run the long reliability scenarios and write their report (default runs/reliability.md).")
    ap.add_argument("--scale", choices=sorted(SCALES), default="long")
    ap.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help="bound for the whole run (default 600)")
    ap.add_argument("--only", default="", help="comma-separated: security,bad,client,overload,redis,cluster,jobs")
    ap.add_argument("--out", type=Path, default=DOC_PATH, help="the Markdown report (default runs/reliability.md)")
    ap.add_argument("--model-path", default=None)
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    code = git_commit()  # before the partial reports rewrite args.out
    t0 = time.monotonic()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def partial(done: list[Outcome]) -> None:  # an interrupted run still leaves its table
        text = render_report(sort_outcomes(done), started, time.monotonic() - t0, "see the final run", args.scale,
                             code)
        args.out.write_text(text.replace("\n| scenario |", "\n**This run did not finish: the table holds "
                                         "the scenarios done so far.**\n\n| scenario |", 1) + "\n", encoding="utf-8")

    def on_term(signum: int, frame: Any) -> None:  # finally blocks run: Redis restarted, children stopped
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    outcomes, model = asyncio.run(run_all(args.scale, args.budget_s, only, args.model_path,
                                          say=lambda m: print(f"[{time.monotonic() - t0:5.0f} s] {m}", flush=True),
                                          on_change=partial))
    report = render_report(outcomes, started, time.monotonic() - t0, model, args.scale, code)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n", encoding="utf-8")
    for o in outcomes:
        print(o.summary() if not o.ok else f"{o.scenario}: {_result(o)}", flush=True)
    print(f"wrote {args.out} in {time.monotonic() - t0:.0f} s")
    return 0 if all(o.ok or o.skipped for o in outcomes) else 1
