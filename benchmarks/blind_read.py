"""The blind read of the campaign set: collect answers over HTTP, write a sheet, score it.

    python benchmarks/blind_read.py collect --name baseline --url http://127.0.0.1:8155
    python benchmarks/blind_read.py collect --name cand --candidate runs/train/x.safetensors
    python benchmarks/blind_read.py sheet --name baseline
    python benchmarks/blind_read.py score --name baseline judge-a.tsv judge-b.tsv

``collect`` asks each system for the campaign set (``data/campaign``) as a visitor's page
does: everyday lines through ``POST /v1/couplets``, names and keywords through ``POST
/v1/couplets/compose`` (length 7, style traditional). A system is a label, a loopback service
and request overrides: by default ``fast``, ``best`` and ``auto`` against one service (the
one at ``--url``, else one started here for ``--model`` or the shipped weights); each
``--candidate PATH`` adds the same qualities served from other weights, labelled
``<candidate-label>-<quality>`` (``--candidate-search PATH``: with their own search weights
too). A service started here runs ``chunlian serve`` on 127.0.0.1
with the result cache off, so that every system's answer is its own (a cached best answer
answers fast and auto). ``auto`` is asked one request at a time: auto at light load. Every
answer (status, ``served``, ``cached``, error code) goes to ``runs/blind/<name>/answers.jsonl``.

``sheet`` writes ``runs/blind/<name>/judge/`` (``sheet.tsv``, the rubric, a judgments
template: the folder a judge gets) and ``runs/blind/<name>/key.json`` (item -> systems);
``score`` reads one judgments file per judge and the key, prints a Markdown table and writes
``runs/blind/<name>/score.json``. Guide: docs/guides/blind-read.md.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from blind_sheet import make_sheet, markdown, read_jsonl, read_judgments, score, write_sheet

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "data" / "campaign"
RUNS = ROOT / "runs" / "blind"
RUBRIC = ROOT / "docs" / "guides" / "blind-read-rubric.md"
QUALITIES = ("fast", "best", "auto")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
COMPOSE = {"length": 7, "style": "traditional"}


@dataclass
class System:
    """A label, where it is served (a URL, or weights to start a service for) and overrides."""

    label: str
    overrides: dict[str, Any]
    url: str | None = None
    model: Path | None = None
    search: Path | None = None  # the quality modes' search weights (None: the service's default)
    concurrency: int = 2
    answers: list[dict[str, Any]] = field(default_factory=list)


def load_inputs(names: int, kinds: tuple[str, ...], limit: int | None = None,
                skip_names: int = 0) -> list[tuple[str, str]]:
    """(kind, input) pairs of the campaign set: every line and keyword, the top ``names``
    less the first ``skip_names`` (a held-out range: 201-400); at most ``limit`` of each kind."""
    def column(file: str, col: str) -> list[str]:
        with (CAMPAIGN / file).open(encoding="utf-8", newline="") as f:
            return [row[col] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]

    table = {"line": column("lines.tsv", "upper"), "name": column("names.tsv", "name")[skip_names:names],
             "keyword": column("keywords.tsv", "keyword")}
    unknown = set(kinds) - set(table)
    if unknown:
        raise SystemExit(f"--inputs: unknown {sorted(unknown)}; choose from {sorted(table)}")
    return [(kind, text) for kind in kinds for text in table[kind][:limit]]


def request_of(kind: str, text: str, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(path, body) a page sends for one input."""
    if kind == "line":
        return "/v1/couplets", {"upper": text, "style": "traditional", **overrides}
    field_name = "heads" if kind == "name" else "keyword"
    return "/v1/couplets/compose", {field_name: text, **COMPOSE, **overrides}


def check_loopback(url: str) -> str:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK:
        raise SystemExit(f"{url}: the blind read talks to loopback services only")
    return url.rstrip("/")


async def ask(client: httpx.AsyncClient, url: str, kind: str, text: str,
              overrides: dict[str, Any], retries: int) -> dict[str, Any]:
    """One answer as a record; 429 and 503 are retried after their Retry-After."""
    path, body = request_of(kind, text, overrides)
    record: dict[str, Any] = {"kind": kind, "input": text, "request": body}
    t0 = time.perf_counter()
    for attempt in range(1, retries + 2):
        record["attempts"] = attempt
        try:
            resp = await client.post(url + path, json=body)
        except httpx.HTTPError as exc:
            record.update(ok=False, status=-1, code=type(exc).__name__, message=str(exc))
            break
        record["status"] = resp.status_code
        data = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if resp.status_code == 200:
            keep = ("upper", "lower", "hengpi", "served", "cached", "model", "style")
            record.update(ok=True, **{k: data.get(k) for k in keep})
            break
        err = data.get("error") or {}
        record.update(ok=False, code=err.get("code"), message=err.get("message"), field=err.get("field"))
        if resp.status_code not in (429, 503) or attempt > retries:
            break
        await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
    record["latency_ms"] = round(1000 * (time.perf_counter() - t0), 1)
    return record


async def collect_system(system: System, inputs: list[tuple[str, str]], timeout_s: float,
                         retries: int) -> None:
    url = system.url
    assert url is not None
    gate = asyncio.Semaphore(system.concurrency)
    done = 0

    async def one(kind: str, text: str) -> dict[str, Any]:
        nonlocal done
        async with gate:
            rec = await ask(client, url, kind, text, system.overrides, retries)
        done += 1
        if done % 50 == 0:
            print(f"  {system.label}: {done}/{len(inputs)}", file=sys.stderr, flush=True)
        return {"system": system.label, **rec}

    limits = httpx.Limits(max_connections=system.concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        system.answers = list(await asyncio.gather(*(one(k, t) for k, t in inputs)))


@contextmanager
def served(model: Path | None, search: Path | None, log: Path) -> Iterator[str]:
    """``chunlian serve`` on a free loopback port for ``model`` and the search weights
    ``search`` (None: the shipped ones), the result cache and warm-up off; yields its URL."""
    from chunlian.bench.spawn import serving
    from chunlian.cluster.procs import free_port

    port = free_port()
    # `chunlian serve` of this interpreter, so that it serves the same chunlian package
    argv = [sys.executable, "-m", "chunlian.cli"]
    env = {**os.environ, "CHUNLIAN_CACHE_SIZE": "0", "CHUNLIAN_WARMUP": "", "CHUNLIAN_LOG_LEVEL": "WARNING"}
    env.pop("CHUNLIAN_REDIS_URL", None)
    if model is not None:
        env["CHUNLIAN_MODEL_PATH"] = str(model)
    if search is not None:
        env["CHUNLIAN_SEARCH_MODEL_PATH"] = str(search)
    with serving([*argv, "serve", "--host", "127.0.0.1", "--port", str(port)], port,
                 what=f"chunlian serve ({model or 'shipped weights'})", limit_s=300.0,
                 env=env, log_path=log) as srv:
        yield srv.url


def systems_of(args: argparse.Namespace) -> list[System]:
    qualities = [q for q in args.systems.split(",") if q]
    bad = set(qualities) - set(QUALITIES)
    if bad:
        raise SystemExit(f"--systems: unknown {sorted(bad)}; choose from {QUALITIES}")
    out = [System(q, {"quality": q}, url=args.url, model=args.model) for q in qualities]
    for n, path in enumerate(args.candidate):
        label = args.candidate_label + (str(n + 1) if len(args.candidate) > 1 else "")
        out += [System(f"{label}-{q}", {"quality": q}, model=Path(path),
                       search=args.candidate_search) for q in qualities]
    for s in out:
        s.concurrency = 1 if s.overrides.get("quality") == "auto" else args.concurrency
        if args.timeout_ms:
            s.overrides["timeout_ms"] = args.timeout_ms
    return out


def cmd_collect(args: argparse.Namespace) -> int:
    out_dir = args.runs / args.name
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = load_inputs(args.names, tuple(args.inputs.split(",")), args.limit, args.skip_names)
    systems = systems_of(args)
    report: dict[str, Any] = {"inputs": dict(Counter(k for k, _ in inputs)), "systems": {}}
    t_all = time.perf_counter()
    with ExitStack() as stack:
        urls: dict[tuple[Path | None, Path | None], str] = {}
        for s in systems:
            if s.url is None:
                weights = (s.model, s.search)
                if weights not in urls:
                    log = out_dir / f"serve-{len(urls)}.log"
                    urls[weights] = stack.enter_context(served(*weights, log))
                s.url = urls[weights]
            s.url = check_loopback(s.url)
            t0 = time.perf_counter()
            print(f"{s.label}: {len(inputs)} inputs at {s.url}", file=sys.stderr, flush=True)
            asyncio.run(collect_system(s, inputs, args.timeout_s, args.retries))
            report["systems"][s.label] = summary(s, time.perf_counter() - t0)
    report["collect_s"] = round(time.perf_counter() - t_all, 1)
    with (out_dir / "answers.jsonl").open("w", encoding="utf-8") as f:
        for s in systems:
            for rec in s.answers:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    (out_dir / "collect.json").write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n",
                                          encoding="utf-8")
    print(json.dumps(report, ensure_ascii=False, indent=2))
    return 0


def summary(s: System, seconds: float) -> dict[str, Any]:
    """Counts of one system's answers: served modes, errors by status and code, cache hits."""
    errors = Counter(f"{a['kind']} {a.get('status')} {a.get('code')}: {a.get('message')}"
                     for a in s.answers if not a["ok"])
    return {"url": s.url, "model": s.model and str(s.model), "search": s.search and str(s.search),
            "overrides": s.overrides,
            "seconds": round(seconds, 1), "answers": len(s.answers),
            "ok": sum(a["ok"] for a in s.answers),
            "served": dict(Counter(f"{a['kind']} {a.get('served')}" for a in s.answers if a["ok"])),
            "cached": sum(bool(a.get("cached")) for a in s.answers), "errors": dict(errors)}


def cmd_sheet(args: argparse.Namespace) -> int:
    run = args.runs / args.name
    answers = read_jsonl(run / "answers.jsonl")
    rows, key = make_sheet(answers, args.seed, dedupe=not args.no_dedupe)
    judge = run / "judge"
    judge.mkdir(parents=True, exist_ok=True)
    write_sheet(judge / "sheet.tsv", rows)
    shutil.copyfile(RUBRIC, judge / "rubric.md")
    (judge / "judgments-template.tsv").write_text(
        "item\taccept\n" + "".join(f"{r['item']}\t\n" for r in rows), encoding="utf-8")
    (run / "key.json").write_text(json.dumps(key, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(rows)} items from {len(answers)} answers ({len(key['errors'])} errors, on no sheet): "
          f"{judge / 'sheet.tsv'}; key: {run / 'key.json'}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    run = args.runs / args.name
    key = json.loads((run / "key.json").read_text(encoding="utf-8"))
    result = score(key, [read_judgments(Path(p)) for p in args.judgments])
    (run / "score.json").write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n",
                                    encoding="utf-8")
    print(markdown(result), end="")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="the run: <runs>/<name>/")
    common.add_argument("--runs", type=Path, default=RUNS, help="where runs go (default runs/blind)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", parents=[common], help="ask each system for the campaign set over HTTP")
    c.add_argument("--url", help="a running service on loopback (default: start one here)")
    c.add_argument("--model", type=Path, help="weights for the service started here")
    c.add_argument("--systems", default="fast,best,auto", help="qualities asked (default fast,best,auto)")
    c.add_argument("--candidate", action="append", default=[], help="other weights: adds the same qualities")
    c.add_argument("--candidate-search", type=Path, help="the candidates' search weights (default: the shipped ones)")
    c.add_argument("--candidate-label", default="candidate")
    c.add_argument("--inputs", default="line,name,keyword", help="kinds of input (default all)")
    c.add_argument("--names", type=int, default=200, help="the most common N names (default 200)")
    c.add_argument("--skip-names", type=int, default=0, help="leave out the first N of those names")
    c.add_argument("--limit", type=int, help="at most N inputs of each kind (a quick check)")
    c.add_argument("--concurrency", type=int, default=2, help="requests in flight per system (auto: 1)")
    c.add_argument("--timeout-s", type=float, default=120.0, help="client timeout a request")
    c.add_argument("--timeout-ms", type=int, help="the requests' timeout_ms (default: the service's)")
    c.add_argument("--retries", type=int, default=3, help="retries of a 429 or 503")
    s = sub.add_parser("sheet", parents=[common], help="write the shuffled, unlabelled sheet and its key")
    s.add_argument("--seed", type=int, default=55)
    s.add_argument("--no-dedupe", action="store_true", help="show identical answers once per system")
    k = sub.add_parser("score", parents=[common], help="acceptance per system from the judges' files")
    k.add_argument("judgments", nargs="+", help="one file per judge (TSV item<TAB>1|0, or JSONL)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return {"collect": cmd_collect, "sheet": cmd_sheet, "score": cmd_score}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
