"""The HTTP load generator: request plans, /metrics arithmetic, and runs against the
in-process app around the fake engine (no sockets, no torch)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chunlian.bench.loadgen import LoadResult, Record, format_report, plot_timeline, run_load_async
from chunlian.bench.plan import (
    STYLES,
    WARMUP_SEED_BASE,
    RequestPlan,
    check_url,
    is_loopback,
    load_lines,
    warmup_body,
)
from chunlian.bench.promtext import cache_counts, metric, metrics_delta, parse_metrics
from chunlian.errors import Overloaded
from tests.unit.api_fakes import running_app

LINES = ["春回大地千山秀", "天增岁月人增寿", "爆竹声声辞旧岁", "一帆风顺年年好", "生意兴隆通四海", "福满人间万户新"]


# ---- lines and plans --------------------------------------------------------------------------


def test_builtin_lines_are_real_and_distinct() -> None:
    lines = load_lines()
    assert len(lines) == 400 == len(set(lines))


def test_load_lines_reads_text_and_tsv(tmp_path: Path) -> None:
    p = tmp_path / "x.tsv"
    p.write_text("upper\tlower\n# comment\n春回大地千山秀\t福满人间万户新\n\n春回大地千山秀\tdup\n天增岁月人增寿\n",
                 encoding="utf-8")
    assert load_lines(p) == ["春回大地千山秀", "天增岁月人增寿"]
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no upper lines"):
        load_lines(empty)


def test_urls() -> None:
    assert check_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    for bad in ("ftp://x", "127.0.0.1:8000", "http://"):
        with pytest.raises(ValueError):
            check_url(bad)
    assert is_loopback("http://127.0.0.1:8000") and is_loopback("http://localhost")
    assert not is_loopback("https://chunlian.example.org")


def test_all_fresh_plan_never_repeats_a_request() -> None:
    plan = RequestPlan(LINES, unique_ratio=1.0)
    bodies = [plan.next_body() for _ in range(len(LINES) * len(STYLES) * 3)]
    keys = {(b["upper"], b["style"], b.get("seed")) for b in bodies}
    assert len(keys) == len(bodies)
    greedy = bodies[: plan.greedy_pool]
    assert all("seed" not in b for b in greedy)  # greedy first, in every style
    assert {b["style"] for b in greedy} == set(STYLES)
    assert all("seed" in b for b in bodies[plan.greedy_pool:])
    assert plan.stats()["sent_fresh_seeded"] == len(bodies) - plan.greedy_pool
    assert plan.hot == []


def test_mixed_plan_keeps_hot_lines_apart_and_is_deterministic() -> None:
    a = RequestPlan(LINES, unique_ratio=0.7, hot_size=2, seed=3)
    b = RequestPlan(LINES, unique_ratio=0.7, hot_size=2, seed=3)
    xs = [a.next_body() for _ in range(2000)]
    assert xs == [b.next_body() for _ in range(2000)]
    assert a.hot == LINES[-2:] and a.fresh == LINES[:-2]
    hot = [x for x in xs if x["upper"] in a.hot]
    assert all(x == {"upper": x["upper"]} for x in hot)  # greedy, default style
    assert all("style" in x for x in xs if x["upper"] not in a.hot)
    assert abs(len(hot) / len(xs) - 0.3) < 0.04
    assert a.sent_hot == len(hot) and a.sent_unique == len(xs) - len(hot)


def test_another_seed_sends_other_fresh_requests() -> None:
    a, b = RequestPlan(LINES, seed=0), RequestPlan(LINES, seed=1)
    xs = [a.next_body() for _ in range(500)]
    ys = [b.next_body() for _ in range(500)]
    assert all("seed" in y for y in ys)
    assert not {json.dumps(x, sort_keys=True) for x in xs} & {json.dumps(y, sort_keys=True) for y in ys}


def test_plan_rejects_bad_ratios() -> None:
    with pytest.raises(ValueError):
        RequestPlan(LINES, unique_ratio=1.5)
    with pytest.raises(ValueError):
        RequestPlan(LINES, unique_ratio=0.5, hot_size=0)


def test_warmup_requests_are_outside_every_plan() -> None:
    body = warmup_body(LINES, 7)
    assert body["seed"] >= WARMUP_SEED_BASE
    plan = RequestPlan(LINES)
    assert all(plan.next_body().get("seed", 0) < WARMUP_SEED_BASE for _ in range(1000))


# ---- /metrics ---------------------------------------------------------------------------------

BEFORE = """# HELP chunlian_cache_requests_total x
# TYPE chunlian_cache_requests_total counter
chunlian_cache_requests_total{store="memory",result="hit"} 10.0
chunlian_cache_requests_total{store="memory",result="miss"} 90.0
chunlian_cache_requests_total{store="memory",result="error"} 0.0
chunlian_cache_requests_total{store="redis",result="hit"} 5.0
chunlian_cache_requests_total{store="redis",result="miss"} 85.0
chunlian_engine_batch_size_sum 100.0
chunlian_engine_batch_size_count 10.0
chunlian_generated_tokens_total 1000.0
chunlian_engine_completed_total 80.0
chunlian_queue_depth 3.0
"""
AFTER = BEFORE.replace('result="hit"} 10.0', 'result="hit"} 40.0').replace(
    'store="memory",result="miss"} 90.0', 'store="memory",result="miss"} 160.0').replace(
    'store="redis",result="hit"} 5.0', 'store="redis",result="hit"} 15.0').replace(
    'store="redis",result="miss"} 85.0', 'store="redis",result="miss"} 145.0').replace(
    "batch_size_sum 100.0", "batch_size_sum 420.0").replace(
    "batch_size_count 10.0", "batch_size_count 20.0").replace(
    "tokens_total 1000.0", "tokens_total 3000.0").replace("completed_total 80.0", "completed_total 140.0")


def test_parse_metrics_and_sums() -> None:
    s = parse_metrics(BEFORE + 'weird{a="x\\"y"} 2\n')
    assert metric(s, "chunlian_cache_requests_total") == 190
    assert metric(s, "chunlian_cache_requests_total", result="hit") == 15
    assert metric(s, "chunlian_cache_requests_total", store="redis", result="miss") == 85
    assert metric(s, "chunlian_queue_depth") == 3
    assert metric(s, "absent") == 0
    assert metric(s, "weird", a='x"y') == 2
    assert cache_counts(s) == (15.0, 100.0)  # lookups: the nearest store (memory) sees them all


def test_parse_metrics_unescapes_label_values() -> None:
    """Backslash, double quote and newline escapes in label values come back as the
    characters they stand for (the text format's rules)."""
    s = parse_metrics('# TYPE m counter\nm_total{path="a\\"b",dir="c:\\\\d",note="x\\ny"} 3\n')
    [(labels, value)] = s["m_total"]
    assert labels == {"path": 'a"b', "dir": "c:\\d", "note": "x\ny"} and value == 3.0
    assert metric(s, "m_total", path='a"b') == 3


def test_parse_metrics_refuses_what_is_not_an_exposition() -> None:
    with pytest.raises(ValueError):
        parse_metrics("<html><body>not metrics</body></html>\n")


def test_metrics_delta() -> None:
    d = metrics_delta(parse_metrics(BEFORE), parse_metrics(AFTER), seconds=4.0)
    # 100 new lookups, 30 memory hits + 10 redis hits
    assert d["cache_lookups"] == 100 and d["cache_hit_ratio"] == 0.4
    assert d["mean_batch_size"] == 32.0 and d["engine_steps"] == 10
    assert d["tokens_per_s"] == 500.0 and d["engine_completed"] == 60
    empty = metrics_delta(parse_metrics(BEFORE), parse_metrics(BEFORE), seconds=1.0)
    assert empty["cache_hit_ratio"] is None and empty["mean_batch_size"] is None


# ---- reports ----------------------------------------------------------------------------------


def _result() -> LoadResult:
    res = LoadResult("http://127.0.0.1:8000", 4, 2.0, 100, window_s=2.0)
    for i in range(100):
        res.records.append(Record(i / 50, (i + 1) / 1000, "200", cached=i % 4 == 0))
    res.records += [Record(1.0, 0.5, "429"), Record(1.5, 30.0, "timeout")]
    res.server_cpu_s = 1.0
    return res


def test_report_figures() -> None:
    rep = _result().report()
    assert rep["ok"] == 100 and rep["requests"] == 102
    assert rep["requests_per_s"] == 50.0
    assert rep["errors"] == {"429": 1, "timeout": 1}
    assert rep["error_rate"] == round(2 / 102, 4)
    assert rep["p50_ms"] == 51.0 and rep["p99_ms"] == 99.0 and rep["max_ms"] == 100.0
    assert rep["hits"] == 25 and rep["misses"] == 75 and rep["cached_share"] == 0.25
    assert rep["mean_hit_ms"] < rep["mean_miss_ms"]
    assert rep["server_cpu_cores"] == 0.5 and rep["requests_per_cpu_s"] == 100.0
    text = format_report(rep)
    assert "requests/s" in text and "429" in text


def test_plot_timeline(tmp_path: Path) -> None:
    out = plot_timeline(_result(), tmp_path / "sub" / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- runs against the in-process app ----------------------------------------------------------


async def test_run_bounded_by_request_count_with_hits_and_errors() -> None:
    async with running_app() as h:
        h.engine.fail[LINES[0]] = Overloaded("queue full", retry_after_s=1.0)
        transport = h.client._transport  # the harness's in-process ASGI transport
        plan = RequestPlan(LINES, unique_ratio=0.5, hot_size=2, seed=1)
        res = await run_load_async("http://unit", concurrency=1, duration_s=30.0, max_requests=60,
                                   plan=plan, transport=transport, sample_interval_s=0.05)
    rep = res.report()
    assert rep["requests"] == 60 and rep["unfinished"] == 0
    # the fake engine fails every request for LINES[0] (any style or seed): fresh ones only
    failures = sum(1 for k in range(plan.sent_unique) if plan.unique_body(k)["upper"] == LINES[0])
    assert failures > 0 and rep["errors"] == {"429": failures}
    # the two hot lines miss once each, then hit
    assert rep["hits"] == plan.sent_hot - 2
    assert rep["cache_hit_ratio"] == pytest.approx(rep["hits"] / 60, abs=1e-3)
    assert rep["mean_batch_size"] == 1.0  # the fake engine reports batches of one
    assert rep["tokens_per_s"] > 0
    assert rep["plan"]["sent_hot"] + rep["plan"]["sent_fresh"] == 60


async def test_run_bounded_by_time_cancels_what_is_in_flight() -> None:
    async with running_app() as h:
        h.engine.hold = asyncio.Event()  # the engine never answers
        transport = h.client._transport  # the harness's in-process ASGI transport
        res = await run_load_async("http://unit", concurrency=3, duration_s=0.3, plan=RequestPlan(LINES),
                                   transport=transport, sample_interval_s=0.1)
        h.engine.hold.set()
    rep = res.report()
    assert rep["ok"] == 0 and rep["unfinished"] == 3
    assert 0.29 <= rep["window_s"] <= 0.5
    assert rep["queue_depth_max"] == 0  # sampled from /metrics while the window was open


async def test_warmup_is_not_measured() -> None:
    async with running_app() as h:
        transport = h.client._transport  # the harness's in-process ASGI transport
        res = await run_load_async("http://unit", concurrency=2, duration_s=5.0, max_requests=10,
                                   plan=RequestPlan(LINES), warmup_s=0.1, transport=transport)
        seeds = [c.params.seed for c in h.engine.calls]
    rep = res.report()
    assert rep["warmup_requests"] > 0 and rep["requests"] == 10
    assert sum(1 for s in seeds if s is not None and s >= WARMUP_SEED_BASE) == rep["warmup_requests"]
    assert rep["engine_completed"] == 10  # /metrics deltas start after the warm-up


# ---- the raw HTTP/1.1 client ------------------------------------------------------------------


async def _canned_server(replies: list[bytes]) -> tuple[asyncio.AbstractServer, int, list[bytes]]:
    """A loopback server answering each request with the next canned reply (b"" = hang)."""
    seen: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                seen.append(head + await reader.readexactly(length))
                reply = replies.pop(0)
                if reply == b"<drop>":  # like a keep-alive timeout racing the request
                    seen.pop()
                    break
                if not reply:
                    await asyncio.sleep(5)
                    return
                writer.write(reply)
                await writer.drain()
                low = reply.lower()
                if b"connection: close" in low or (b"content-length" not in low and b"chunked" not in low):
                    break  # asked to close, or the body ends with the connection
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    _canned_server.connections = connections  # type: ignore[attr-defined]
    return server, server.sockets[0].getsockname()[1], seen


async def test_raw_connection_reads_every_framing_and_reconnects() -> None:
    from chunlian.bench.rawhttp import RawConnection

    ok = b'{"lower":"x","cached":true}'
    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"cac\r\n10\r\nhed\": false, \"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
        b'HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}',
        b'HTTP/1.1 200 OK\r\n\r\n{"cached": false}',  # close-delimited (HTTP/1.0 style)
        b"",  # never answers
    ]
    server, port, seen = await _canned_server(replies)
    async with server:
        conn = RawConnection("127.0.0.1", port, timeout_s=0.5)
        body = json.dumps({"upper": "春回大地千山秀"}, ensure_ascii=False).encode()
        assert await conn.post("/v1/couplets", body) == ("200", True)
        assert await conn.post("/v1/couplets", body) == ("200", False)
        assert await conn.post("/v1/couplets", body) == ("429", None)
        assert conn.writer is None  # the server said close
        assert await conn.post("/v1/couplets", body) == ("200", False)
        assert await conn.post("/v1/couplets", body) == ("timeout", None)
        conn.close()
    assert len(seen) == 5
    assert seen[0].startswith(b"POST /v1/couplets HTTP/1.1\r\n")
    assert seen[0].endswith(body) and b"Content-Type: application/json" in seen[0]


async def test_raw_connection_resends_once_when_a_kept_alive_connection_was_closed() -> None:
    from chunlian.bench.rawhttp import RawConnection

    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n{\"cached\": true}"
    server, port, seen = await _canned_server([ok, b"<drop>", ok, ok])
    async with server:
        conn = RawConnection("127.0.0.1", port, timeout_s=2.0)
        assert await conn.post("/v1/couplets", b"{}") == ("200", True)
        assert await conn.post("/v1/couplets", b"{}") == ("200", True)  # dropped, sent again
        conn.IDLE_REUSE_S = 0.05
        await asyncio.sleep(0.1)
        assert await conn.post("/v1/couplets", b"{}") == ("200", True)  # idle: a new connection
        conn.close()
    assert len(seen) == 3
    assert len(_canned_server.connections) == 3  # type: ignore[attr-defined]


async def test_raw_connection_request_gives_headers_and_raises_on_errors() -> None:
    """``request`` (cluster_bench's exchange): status, header names in lower case with their
    values as sent, the body; a timeout raises and closes the connection."""
    from chunlian.bench.rawhttp import RawConnection

    reply = b"HTTP/1.1 503 Service Unavailable\r\nX-Chunlian-Instance: Inst-B\r\nContent-Length: 4\r\n\r\nbusy"
    server, port, seen = await _canned_server([reply, b""])
    async with server:
        conn = RawConnection("127.0.0.1", port, timeout_s=0.5)
        status, headers, body = await conn.request(b"GET", "/nginx-health")
        assert (status, headers["x-chunlian-instance"], body) == (503, "Inst-B", b"busy")
        with pytest.raises(TimeoutError):
            await conn.request(b"POST", "/v1/couplets", b"{}")
        assert conn.writer is None
    assert seen[0].startswith(b"GET /nginx-health HTTP/1.1\r\n")


async def test_raw_connection_sends_from_its_source_address() -> None:
    """``source_host`` picks the client's address (any of 127.0.0.0/8 on Linux), so one
    load generator can act as several clients (benchmarks/rate_limit_bench.py)."""
    from chunlian.bench.rawhttp import RawConnection

    peers: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}')
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        for source in ("127.0.0.7", None):
            conn = RawConnection("127.0.0.1", port, timeout_s=2.0, source_host=source)
            assert await conn.post("/v1/couplets", b"") == ("200", False)
            conn.close()
    assert peers == ["127.0.0.7", "127.0.0.1"]


async def test_raw_connection_reports_refused_connections() -> None:
    from chunlian.bench.rawhttp import RawConnection
    from chunlian.cluster.procs import free_port

    conn = RawConnection("127.0.0.1", free_port(), timeout_s=2.0)
    status, cached = await conn.post("/v1/couplets", b"{}")
    assert status == "transport:ConnectionRefusedError" and cached is None


async def test_auto_client_choice() -> None:
    with pytest.raises(ValueError, match="cannot drive"):
        await run_load_async("https://127.0.0.1:1", client_kind="raw")


def test_engine_bench_sequential_sample_has_the_mix_lengths() -> None:
    """The sequential run's sample spans the whole length range of the mix (its first
    lines are its short ones: a prefix would flatter sequential throughput)."""
    from chunlian.bench.engine import length_sample, mixed_lines

    mix = mixed_lines(800)
    sample = length_sample(mix, 100)
    assert len(sample) == 100 and set(sample) <= set(mix)
    mean_mix = sum(map(len, mix)) / len(mix)
    mean_sample = sum(map(len, sample)) / len(sample)
    assert abs(mean_sample - mean_mix) < 0.05 * mean_mix
    assert sum(map(len, mix[:100])) / 100 < 0.8 * mean_mix  # what the old prefix measured
    assert max(map(len, sample)) > 20 and min(map(len, sample)) <= 5
    assert length_sample(mix[:10], 100) == mix[:10]


def test_percentile_is_the_nearest_rank_of_the_sorted_sample() -> None:
    from chunlian.bench.common import percentile

    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(xs, q) for q in (0, 25, 50, 75, 100)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(list(range(1, 101)), 99) == 99  # round(0.99 * 99) = 98: the 99th value
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0
