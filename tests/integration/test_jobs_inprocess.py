"""Embedded jobs (no broker) through real HTTP on the real engine, and ``chunlian jobs
submit --wait`` as a real process against that server."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunlian.config import load_settings
from chunlian.text import is_han
from tests.integration.live_server import LiveServer, model_path, serving
from tests.integration.test_jobs_celery import ROOT, uppers, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = load_settings(
        model_path=model_path(tmp_path_factory.mktemp("model")), device="cpu", max_batch_size=16,
        warmup=("春回大地千山秀",), torch_threads=1, broker_url="",
    )
    with serving(settings) as server:
        yield server


def test_in_process_job_completes_via_the_api(live: LiveServer) -> None:
    lines = uppers(60)
    items = [{"upper": u} for u in lines] + [{"heads": "李明", "length": 5}, {"keyword": "新春"}]
    with httpx.Client(base_url=live.base_url, timeout=60) as c:
        r = c.post("/v1/jobs", json={"items": items})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        # interactive traffic is answered while the job runs
        t0 = time.perf_counter()
        assert c.post("/v1/couplets", json={"upper": "天增岁月人增寿"}).status_code == 200
        assert time.perf_counter() - t0 < 30

        def done() -> dict | None:
            body = c.get(f"/v1/jobs/{job_id}", params={"limit": 1000}).json()
            return body if body["status"] in ("done", "failed") else None

        body = wait_until(done, 300, "the in-process job")
    assert body["progress"] == {"done": 62, "failed": 0, "cancelled": 0, "total": 62}
    res = body["results"]
    assert [r["index"] for r in res] == list(range(62))
    assert [r["upper"] for r in res[:60]] == lines
    for r in res:
        assert r["status"] == "done" and len(r["lower"]) == len(r["upper"])
        assert all(is_han(ch) for ch in r["hengpi"]) and r["model"].startswith("chunlian-couplet@")
    assert res[60]["upper"][0] == "李" and res[60]["lower"][0] == "明" and len(res[60]["upper"]) == 5
    assert res[61]["upper"].startswith("新春")
    # a job is best by default: its 上联 items are searched (width 8 while interactive work
    # runs beside them), and so are its compose items (two stages: engine.composed)
    assert {r["served"] for r in res} <= {"best", "good"} and "best" in {r["served"] for r in res[:60]}


def test_cli_submit_wait_writes_results(live: LiveServer, tmp_path: Path) -> None:
    src = tmp_path / "uppers.txt"
    lines = uppers(25)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "results.csv"
    cmd = [sys.executable, "-m", "chunlian.cli", "jobs", "submit", str(src), "--style", "business",
           "--wait", "--out", str(out), "--url", live.base_url, "--poll-s", "0.2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "25 done, 0 failed" in p.stderr and "item" in p.stderr  # summary and the progress bar
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [r["upper"] for r in rows] == lines
    assert {r["status"] for r in rows} == {"done"} and {r["style"] for r in rows} == {"business"}
    # without --wait: the job id, at once; its results later, by id
    p = subprocess.run(cmd[:6] + ["--url", live.base_url], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    job_id = json.loads(p.stdout)["job_id"]
    assert len(job_id) == 32
    fetch = [sys.executable, "-m", "chunlian.cli", "jobs", "results", job_id, "--url", live.base_url]
    now = subprocess.run(fetch, capture_output=True, text=True, timeout=120, cwd=ROOT)  # as it stands
    assert now.returncode in (0, 1), now.stderr  # 1 while it runs
    rows_now = [json.loads(line) for line in now.stdout.splitlines()]
    assert [r["index"] for r in rows_now] == list(range(25))
    assert {r["status"] for r in rows_now} <= {"done", "pending"}
    assert (now.returncode == 0) == all(r["status"] == "done" for r in rows_now)
    later = tmp_path / "later.csv"
    p = subprocess.run(fetch + ["--wait", "--poll-s", "0.2", "--out", str(later)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0 and "25 done, 0 failed" in p.stderr, p.stderr
    rows = list(csv.DictReader(later.open(encoding="utf-8")))
    assert [r["upper"] for r in rows] == lines and {r["status"] for r in rows} == {"done"}
    p = subprocess.run(fetch[:5] + ["0" * 32, "--url", live.base_url], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 1 and "no job" in p.stderr and p.stdout == ""
    # the newest jobs, newest first: this one heads the list
    listing = [sys.executable, "-m", "chunlian.cli", "jobs", "list", "--limit", "2", "--url", live.base_url]
    p = subprocess.run(listing, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    table = p.stdout.splitlines()
    assert table[0].startswith("job id") and len(table) == 3
    assert table[1].split()[:3] == [job_id, "done", "25"]
    p = subprocess.run(listing + ["--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert json.loads(p.stdout.splitlines()[0])["job_id"] == job_id
    # a bad line: exit 2, naming the line
    bad = tmp_path / "bad.txt"
    bad.write_text("春回大地千山秀\nhello\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "chunlian.cli", "jobs", "submit", str(bad), "--url", live.base_url],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "item 2" in p.stderr and "upper" in p.stderr


def test_cli_splits_a_long_file_into_jobs_and_collects_them_as_one(live: LiveServer, tmp_path: Path) -> None:
    src = tmp_path / "uppers.txt"
    lines = uppers(25)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    submit = [sys.executable, "-m", "chunlian.cli", "jobs", "submit", str(src), "--items-per-job", "10",
              "--url", live.base_url]
    p = subprocess.run(submit, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    jobs = [json.loads(line) for line in p.stdout.splitlines()]
    assert [j["total"] for j in jobs] == [10, 10, 5]
    out = tmp_path / "all.jsonl"
    p = subprocess.run([sys.executable, "-m", "chunlian.cli", "jobs", "results", *(j["job_id"] for j in jobs),
                        "--wait", "--poll-s", "0.2", "--no-progress", "--out", str(out), "--url", live.base_url],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0 and "3 jobs: done: 25 done, 0 failed" in p.stderr, p.stderr
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in rows] == list(range(25)) and [r["upper"] for r in rows] == lines
    # --wait on submit: the same, in one go
    p = subprocess.run(submit + ["--wait", "--no-progress", "--poll-s", "0.2"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0 and "3 jobs: done: 25 done" in p.stderr, p.stderr
    assert [json.loads(line)["upper"] for line in p.stdout.splitlines()] == lines
    # a bad line in the third job: nothing is left queued, and the line is named in the whole file
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines[:22] + ["hello"] + lines[22:]) + "\n", encoding="utf-8")
    p = subprocess.run([*submit[:5], str(bad), *submit[6:]], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert "(item 23)" in p.stderr and "cancelled the 2 job(s) already submitted" in p.stderr, p.stderr


def test_cli_quality_job_answers_what_the_offline_quality_mode_does(live: LiveServer, tmp_path: Path) -> None:
    from chunlian.offline import OfflineGenerator, couplet_request

    lines = uppers(3)
    src = tmp_path / "uppers.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "chunlian.cli", "jobs", "submit", str(src), "--quality", "--wait",
           "--out", str(out), "--url", live.base_url, "--poll-s", "0.2", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = OfflineGenerator.load_quality().generate([couplet_request(u) for u in lines])
    assert [r["upper"] for r in rows] == lines
    assert [(r["lower"], r["hengpi"], r["model"]) for r in rows] == [
        (w.best.lower, w.best.hengpi, w.model) for w in want if not isinstance(w, Exception)]
    assert "@rev-" in rows[0]["model"]  # the reverse-trained weights' search wrote them

