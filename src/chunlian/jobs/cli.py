"""``chunlian jobs submit|status|results|list|cancel`` (an HTTP client) and ``chunlian worker``.

``chunlian jobs submit FILE`` reads one 上联 per line, or a TSV whose header names its
columns (``upper``, or ``heads``/``keyword`` with ``length``; ``style``, ``n``, ``seed``
optional), submits one job and prints its id; with ``--wait`` it shows a progress bar
until the job finishes and writes every result, in input order, as JSONL (or CSV when
``--out`` ends in ``.csv``; stdout when there is no ``--out``). A file longer than a job's
limit (``MAX_JOB_ITEMS``) becomes several jobs, all or none, collected into one file. ``chunlian jobs results
JOB_ID`` writes the same for a job submitted earlier: as it stands (items not run yet say
``pending``), or after waiting for it with ``--wait``; several ids give one file.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chunlian.cliargs import add_log_level, add_no_progress, hidden_alias, whole_number
from chunlian.jobs.items import MAX_JOB_ITEMS, response_error
from chunlian.retry import MAX_RETRIES, RETRY_STATUSES, retry_after_s

CSV_FIELDS = ("index", "status", "upper", "lower", "hengpi", "style", "model", "error_code", "error")
_COLUMNS = {"upper", "heads", "keyword", "length", "style", "n", "seed"}
_INT_COLUMNS = {"length", "n", "seed"}


def read_items(path: Path, style: str | None) -> list[dict[str, Any]]:
    """Items from a file: one 上联 per line, or a TSV with a header naming its columns."""
    lines = [ln.rstrip("\r\n") for ln in path.read_text(encoding="utf-8-sig").splitlines()]
    lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    header = [h.strip() for h in lines[0].split("\t")] if lines else []
    items: list[dict[str, Any]] = []
    if header and set(header) <= _COLUMNS and header[0] in _COLUMNS and (
            "upper" in header or "heads" in header or "keyword" in header):
        for ln in lines[1:]:
            item: dict[str, Any] = {}
            for name, value in zip(header, ln.split("\t"), strict=False):
                value = value.strip()
                if value:
                    item[name] = int(value) if name in _INT_COLUMNS and value.lstrip("-").isdigit() else value
            items.append(item)
    else:
        items = [{"upper": ln.split("\t")[0].strip()} for ln in lines]
    if style:
        for item in items:
            item.setdefault("style", style)
    return items


def _polite_transport(sleep: Any = time.sleep) -> Any:
    """An httpx transport that waits out a 429 or 503 (``Retry-After``) and sends the request
    again, up to ``MAX_RETRIES`` times: a per-client rate in front of the service (or an
    instance that is not ready yet) slows a long job's polling and paging instead of failing it."""
    import httpx

    class Polite(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            for attempt in range(MAX_RETRIES + 1):
                response = super().handle_request(request)
                if response.status_code not in RETRY_STATUSES or attempt == MAX_RETRIES:
                    return response
                wait = retry_after_s(response.headers.get("retry-after"), attempt)
                response.close()
                print(f"chunlian jobs: HTTP {response.status_code} from {request.url.path}; "
                      f"trying again in {wait:g} s", file=sys.stderr)
                sleep(wait)
            raise AssertionError("unreachable")

    return Polite()


def _http_command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command that talks to the service: an unreachable or silent service is one line
    on stderr and exit status 1, not a traceback."""
    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        import httpx

        from chunlian.config import load_client_settings

        client = load_client_settings()  # what the flags leave unsaid
        args.url = args.url or client.url
        args.api_key = args.api_key or client.api_key
        try:
            return fn(args)
        except httpx.TransportError as e:
            return _fail(f"no answer from {args.url}: {type(e).__name__}: {e}")

    return run


def _client(args: argparse.Namespace) -> Any:
    import httpx

    return httpx.Client(base_url=args.url.rstrip("/"), timeout=args.timeout_s, transport=_polite_transport(),
                        headers={"X-API-Key": args.api_key} if args.api_key else {})


def _error_text(r: Any, first_line: int = 1) -> str:
    err = response_error(r)
    if err is None:
        return f"HTTP {r.status_code}"
    code, message, field = err
    msg = f"{code}: {message}"
    # items.7.upper -> the file's line for item 7
    m = re.match(r"items\.(\d+)", str(field or ""))
    if m:
        msg += f" (item {int(m.group(1)) + first_line})"
    return msg


def _fail(msg: str, code: int = 1) -> int:
    print(f"chunlian jobs: error: {msg}", file=sys.stderr)
    return code


def wait_for(client: Any, job_id: str, poll_s: float, progress: bool = True) -> dict[str, Any]:
    """Poll until the job finishes (done, failed or cancelled); a tqdm bar on stderr."""
    from tqdm import tqdm

    bar = None
    try:
        while True:
            r = client.get(f"/v1/jobs/{job_id}", params={"limit": 0})
            if r.status_code != 200:
                raise RuntimeError(_error_text(r))
            body = r.json()
            p = body["progress"]
            finished = p["done"] + p["failed"] + p["cancelled"]
            if progress:
                if bar is None:
                    bar = tqdm(total=p["total"], unit="item", desc=f"job {job_id[:8]}", file=sys.stderr)
                bar.set_postfix(failed=p["failed"], status=body["status"], refresh=False)
                bar.update(finished - bar.n)
            if body["status"] in ("done", "failed", "cancelled") and finished >= p["total"]:
                return body  # type: ignore[no-any-return]
            time.sleep(poll_s)
    finally:
        if bar is not None:
            bar.close()


def fetch_results(client: Any, job_id: str, total: int, page: int = 1000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for offset in range(0, total, page):
        r = client.get(f"/v1/jobs/{job_id}", params={"offset": offset, "limit": page})
        if r.status_code != 200:
            raise RuntimeError(_error_text(r))
        out.extend(r.json()["results"])
    return out


def write_results(results: list[dict[str, Any]], out: Path | None) -> None:
    if out is not None and out.suffix.lower() == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            err = r.get("error") or {}
            w.writerow({**r, "error_code": err.get("code", ""), "error": err.get("message", "")})
        out.write_text(buf.getvalue(), encoding="utf-8")
        return
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")


@_http_command
def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        return _fail(f"no such file: {path}", 2)
    items = read_items(path, args.style)
    if not items:
        return _fail(f"{path} holds no items", 2)
    per_job = args.items_per_job
    with _client(args) as client:
        submitted: list[tuple[str, int]] = []  # (job id, items) in file order
        for start in range(0, len(items), per_job):
            part = items[start:start + per_job]
            body = {"items": part, **({"quality": args.quality} if args.quality else {})}
            r = client.post("/v1/jobs", json=body)
            if r.status_code != 202:
                for job_id, _ in submitted:  # all or nothing: a file is one piece of work
                    client.delete(f"/v1/jobs/{job_id}")
                undone = f" (cancelled the {len(submitted)} job(s) already submitted)" if submitted else ""
                return _fail(_error_text(r, first_line=start + 1) + undone, 2 if r.status_code == 422 else 1)
            submitted.append((r.json()["job_id"], len(part)))
        if not args.wait:
            for job_id, total in submitted:  # one line a job, in file order
                print(json.dumps({"job_id": job_id, "total": total}))
            return 0
        for job_id, total in submitted:
            print(f"job {job_id}: {total} items", file=sys.stderr)
        return _collect(client, [job_id for job_id, _ in submitted], args, wait=True)


def _collect(client: Any, job_ids: list[str], args: argparse.Namespace, wait: bool) -> int:
    """Write the jobs' results, one file in job order with ``index`` counted across them
    (``--out``, else stdout), after waiting for each (``wait``) or as they stand (items not
    run yet are ``"status": "pending"``); a summary on stderr. Exit status 0 when every job
    is done, 1 otherwise (failed, cancelled, still running)."""
    results: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    try:
        for job_id in job_ids:
            if wait:
                body = wait_for(client, job_id, args.poll_s, progress=not args.no_progress)
            else:
                r = client.get(f"/v1/jobs/{job_id}", params={"limit": 0})
                if r.status_code != 200:
                    raise RuntimeError(_error_text(r))
                body = r.json()
            base = len(results)
            results += [{**x, "index": x["index"] + base}
                        for x in fetch_results(client, job_id, body["progress"]["total"])]
            bodies.append(body)
    except RuntimeError as e:
        return _fail(str(e))
    write_results(results, Path(args.out) if args.out else None)
    count = {k: sum(b["progress"][k] for b in bodies) for k in ("total", "done", "failed", "cancelled")}
    pending = count["total"] - count["done"] - count["failed"] - count["cancelled"]
    states = sorted({b["status"] for b in bodies})
    what = f"job {job_ids[0]}" if len(job_ids) == 1 else f"{len(job_ids)} jobs"
    print(f"{what}: {'/'.join(states)}: {count['done']} done, {count['failed']} failed, "
          f"{count['cancelled']} cancelled" + (f", {pending} pending" if pending > 0 else "")
          + (f"; results in {args.out}" if args.out else ""), file=sys.stderr)
    return 0 if states == ["done"] else 1


@_http_command
def cmd_results(args: argparse.Namespace) -> int:
    """Jobs' results by id (for jobs submitted without ``--wait``; several ids, as ``submit``
    printed them for a file split into jobs, give one file)."""
    with _client(args) as client:
        return _collect(client, list(args.job_id), args, wait=args.wait)


@_http_command
def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        r = client.get(f"/v1/jobs/{args.job_id}", params={"limit": 0})
    if r.status_code != 200:
        return _fail(_error_text(r))
    body = r.json()
    body.pop("results", None)
    print(json.dumps(body, ensure_ascii=False))
    return 0


@_http_command
def cmd_list(args: argparse.Namespace) -> int:
    """The newest jobs: a table, or one JSON object a job with ``--json``."""
    with _client(args) as client:
        r = client.get("/v1/jobs", params={"limit": args.limit})
    if r.status_code != 200:
        return _fail(_error_text(r))
    jobs = r.json()["jobs"]
    if args.json:
        for job in jobs:
            print(json.dumps(job, ensure_ascii=False))
        return 0
    print(f"{'job id':<32}  {'status':<9}  {'done':>6}  {'failed':>6}  {'total':>6}  created (UTC)")
    for job in jobs:
        p = job["progress"]
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(job["created_at"]))
        print(f"{job['job_id']:<32}  {job['status']:<9}  {p['done']:>6}  {p['failed']:>6}  {p['total']:>6}  {created}")
    return 0


@_http_command
def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        r = client.delete(f"/v1/jobs/{args.job_id}")
    if r.status_code != 200:
        return _fail(_error_text(r))
    print(json.dumps(r.json(), ensure_ascii=False))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a Celery worker for the job queue (this process becomes the worker)."""
    from chunlian.config import load_settings
    from chunlian.omp import set_spin_wait

    settings = load_settings(broker_url=args.broker_url, job_queue=args.queue,
                             worker_engine_url=args.engine_url)
    # before anything imports torch: a worker shares its cores (chunlian.omp says why)
    set_spin_wait(settings.omp_spin, shared=True)
    from chunlian.jobs.celery_app import get_app

    app = get_app(settings)  # ConfigError (exit 2) without a broker; the pool's processes fork from here
    if settings.worker_nice:  # the pool's processes are forked from this one: they inherit it
        os.nice(settings.worker_nice)
    argv = [
        "worker", f"--concurrency={args.concurrency}", f"--loglevel={args.log_level}",
        f"--queues={settings.job_queue}", f"--hostname=chunlian-{os.getpid()}@%h",
        "--pool=prefork", "--without-gossip", "--without-mingle",
    ]
    app.worker_main(argv)
    return 0


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="the service (default: $CHUNLIAN_URL or http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=None, help="X-API-Key (default: $CHUNLIAN_API_KEY)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="seconds per HTTP request (default 60)")
    hidden_alias(p, "--timeout", "timeout_s", type=float)


def register(sub: Any) -> None:
    """Add ``chunlian jobs ...`` and ``chunlian worker``."""
    jobs = sub.add_parser("jobs", help="bulk jobs: submit a file, poll, fetch results, cancel")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    s = jsub.add_parser("submit", help="submit a file of upper lines (or a TSV) as one job")
    s.add_argument("file", help="one 上联 per line, or a TSV whose header names its columns")
    s.add_argument("--style", default=None, help="style for items that do not name one")
    s.add_argument("--wait", action="store_true", help="wait with a progress bar, then write results")
    s.add_argument("--quality", nargs="?", const="best", default=None, choices=("best", "fast", "auto"),
                   help="the job's quality field: best (the server's default; --quality alone) searches every "
                        "上联 item with the quality mode, fast decodes greedily")
    s.add_argument("--out", default=None, help="results file (.jsonl, or .csv); default stdout")
    s.add_argument("--poll-s", type=float, default=1.0, help="seconds between status polls (default 1)")
    add_no_progress(s, old_quiet=True)
    s.add_argument("--items-per-job", type=whole_number(1, MAX_JOB_ITEMS, "items", " (a job's limit)"), default=MAX_JOB_ITEMS, metavar="N",
                   help=f"a longer file is submitted as several jobs of N items (default and most {MAX_JOB_ITEMS}, "
                        "a job's limit); without --wait one line is printed a job")
    _client_flags(s)
    s.set_defaults(fn=cmd_submit)
    st = jsub.add_parser("status", help="a job's status and progress")
    st.add_argument("job_id", help="the id 'jobs submit' printed")
    _client_flags(st)
    st.set_defaults(fn=cmd_status)
    res = jsub.add_parser("results", help="write a job's results (.jsonl or .csv), waiting for it with --wait")
    res.add_argument("job_id", nargs="+", help="one or more job ids (several: one file, in this order)")
    res.add_argument("--wait", action="store_true", help="wait with a progress bar until the job has finished")
    res.add_argument("--out", default=None, help="results file (.jsonl, or .csv); default stdout")
    res.add_argument("--poll-s", type=float, default=1.0, help="seconds between status polls (default 1)")
    add_no_progress(res, old_quiet=True)
    _client_flags(res)
    res.set_defaults(fn=cmd_results)
    ls = jsub.add_parser("list", help="the newest jobs, newest first")
    ls.add_argument("--limit", type=int, default=20, help="how many (1-100, default 20)")
    ls.add_argument("--json", action="store_true", help="one JSON object a job instead of a table")
    _client_flags(ls)
    ls.set_defaults(fn=cmd_list)
    c = jsub.add_parser("cancel", help="cancel what has not run of a job")
    c.add_argument("job_id", help="the id 'jobs submit' printed")
    _client_flags(c)
    c.set_defaults(fn=cmd_cancel)

    w = sub.add_parser("worker", help="run a Celery worker for bulk jobs (needs CHUNLIAN_BROKER_URL)")
    w.add_argument("--concurrency", type=int, default=1, help="worker processes (each loads the model)")
    add_log_level(w, "INFO", old="--loglevel")
    w.add_argument("--broker-url", default=None, help="redis:// URL (default: $CHUNLIAN_BROKER_URL)")
    hidden_alias(w, "--broker", "broker_url")
    w.add_argument("--queue", default=None, help="queue name (default: $CHUNLIAN_JOB_QUEUE)")
    w.add_argument("--engine-url", default=None,
                   help="send items to this serving instance's engine (bulk priority) instead of "
                        "loading the model in the worker")
    w.set_defaults(fn=cmd_worker)
