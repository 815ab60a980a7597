"""One chunk in a worker (``jobs.worker.process_chunk``) with a fake executor: sub-batches,
poison isolation, retries and their bookkeeping, the final attempt, cancellation, items
seen again after a lost worker, the soft time limit."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from chunlian.errors import InvalidInput, ModelError
from chunlian.jobs.items import CANCELLED_ENTRY, Spec, request_of, spec_of
from chunlian.jobs.store import MemoryJobStore
from chunlian.jobs.worker import (
    MAX_TRIES,
    Outcome,
    RetryChunk,
    fail_remaining,
    process_chunk,
)
from chunlian.types import Couplet, CoupletResult


class FakeExecutor:
    """Answers each upper with a couplet; ``poison`` raise whenever they are in a batch,
    ``flaky`` raise the first ``n`` times they are run."""

    def __init__(self, batch_size: int = 4, poison: Sequence[str] = (), flaky: dict[str, int] | None = None,
                 soft_limit_after: int | None = None) -> None:
        self.batch_size = batch_size
        self.poison = set(poison)
        self.flaky = dict(flaky or {})
        self.calls: list[list[str]] = []
        self.soft_limit_after = soft_limit_after

    def run(self, specs: Sequence[Spec]) -> list[Outcome]:
        texts = [s["upper"] for s in specs]
        self.calls.append(texts)
        if self.soft_limit_after is not None and len(self.calls) > self.soft_limit_after:
            raise SoftTimeLimitExceeded()
        if self.poison & set(texts):
            raise RuntimeError("model crashed")
        for t in texts:
            if self.flaky.get(t, 0) > 0:
                self.flaky[t] -= 1
                raise RuntimeError("flaky")
        out: list[Outcome] = []
        for t in texts:
            if t.startswith("坏"):
                out.append(ModelError("no couplet satisfied the rules"))
            else:
                out.append(CoupletResult(Couplet(t, "下" * len(t), "万象更新", "traditional"), (), "fake@1"))
        return out


def chunk(texts: list[str], start: int = 0) -> list[tuple[int, Spec]]:
    return [(start + i, {"style": "traditional", "upper": t}) for i, t in enumerate(texts)]


TEXTS = [f"春回大地{c}山秀" for c in "一二三四五六七八九十"]


@pytest.fixture
def store() -> MemoryJobStore:
    s = MemoryJobStore(ttl_s=3600)
    s.create("j", 10)
    return s


def test_a_chunk_runs_in_sub_batches_and_records_every_item(store: MemoryJobStore) -> None:
    ex = FakeExecutor(batch_size=4)
    report = process_chunk("j", chunk(TEXTS), store, ex)
    assert [len(c) for c in ex.calls] == [4, 4, 2]
    assert report.done == 10 and not report.transient
    st = store.state("j")
    assert st is not None and st.status == "done" and st.done == 10
    assert set(store.tries("j").values()) == {1}


def test_a_redelivered_chunk_does_only_what_is_left(store: MemoryJobStore) -> None:
    process_chunk("j", chunk(TEXTS[:5]), store, FakeExecutor())
    ex = FakeExecutor()
    report = process_chunk("j", chunk(TEXTS), store, ex)  # the whole chunk again
    assert report.skipped == 5 and report.done == 5
    assert sorted(t for c in ex.calls for t in c) == sorted(TEXTS[5:])
    assert store.state("j").done == 10  # type: ignore[union-attr]


def test_poison_item_fails_alone_after_max_tries(store: MemoryJobStore) -> None:
    poison = TEXTS[2]
    ex = FakeExecutor(poison=[poison])
    for attempt in range(1, MAX_TRIES):
        with pytest.raises(RetryChunk):
            process_chunk("j", chunk(TEXTS), store, ex)
        assert store.tries("j")[2] == attempt
        assert store.state("j").done == 9  # type: ignore[union-attr]
    report = process_chunk("j", chunk(TEXTS), store, ex)  # the 3rd try: recorded, not raised
    assert report.failed == 1
    st = store.state("j")
    assert st is not None and (st.done, st.failed) == (9, 1) and st.status == "done"
    entry = store.results("j", 2, 1)[0]
    assert entry["status"] == "failed" and entry["error"]["code"] == "item_failed"
    assert f"after {MAX_TRIES} tries: RuntimeError: model crashed" in entry["error"]["message"]
    assert store.tries("j") == {i: (MAX_TRIES if i == 2 else 1) for i in range(10)}
    # retries ran the poison alone: its neighbours were not re-run
    assert ex.calls[-1] == [poison]


def test_a_flaky_item_succeeds_on_retry(store: MemoryJobStore) -> None:
    ex = FakeExecutor(flaky={TEXTS[0]: 2})  # fails in its sub-batch and again alone
    with pytest.raises(RetryChunk):
        process_chunk("j", chunk(TEXTS), store, ex)
    process_chunk("j", chunk(TEXTS), store, ex)
    assert store.state("j").done == 10 and store.tries("j")[0] == 2  # type: ignore[union-attr]


def test_the_final_attempt_never_raises(store: MemoryJobStore) -> None:
    ex = FakeExecutor(flaky={TEXTS[0]: 5})
    report = process_chunk("j", chunk(TEXTS), store, ex, final_attempt=True)
    assert report.failed == 1 and store.state("j").finished  # type: ignore[union-attr]


def test_permanent_errors_fail_at_once(store: MemoryJobStore) -> None:
    texts = ["坏" + t[1:] if i == 3 else t for i, t in enumerate(TEXTS)]
    report = process_chunk("j", chunk(texts), store, FakeExecutor())
    assert (report.done, report.failed) == (9, 1)
    assert store.results("j", 3, 1)[0]["error"]["code"] == "model_error"
    assert store.tries("j")[3] == 1


def test_a_cancelled_job_is_not_run(store: MemoryJobStore) -> None:
    process_chunk("j", chunk(TEXTS[:4]), store, FakeExecutor())
    store.cancel("j")
    ex = FakeExecutor()
    report = process_chunk("j", chunk(TEXTS), store, ex)
    assert ex.calls == [] and report.skipped == 10
    st = store.state("j")
    assert st is not None and (st.done, st.cancelled, st.status) == (4, 6, "cancelled")


def test_cancel_between_sub_batches_stops_the_rest() -> None:
    store = MemoryJobStore(ttl_s=60)
    store.create("j", 10)

    class CancelAfterFirst(FakeExecutor):
        def run(self, specs: Sequence[Spec]) -> list[Outcome]:
            out = super().run(specs)
            store.record("j", [])  # nothing
            store.cancel("j") if len(self.calls) == 1 else None
            return out

    ex = CancelAfterFirst(batch_size=4)
    process_chunk("j", chunk(TEXTS), store, ex)
    assert len(ex.calls) == 1
    st = store.state("j")
    assert st is not None and st.done == 0 and st.cancelled == 10  # the cancel came first


def test_items_seen_after_a_lost_worker_run_alone_then_give_up(store: MemoryJobStore) -> None:
    # the worker died while items 0..3 ran: each had one try counted, none has a result
    store.begin_attempt("j", [0, 1, 2, 3])
    ex = FakeExecutor(batch_size=4)
    process_chunk("j", chunk(TEXTS), store, ex)
    assert ex.calls[:4] == [[t] for t in TEXTS[:4]] and [len(c) for c in ex.calls[4:]] == [4, 2]
    # an item whose worker was lost MAX_TRIES times is failed without being run
    store.create("k", 2)
    for _ in range(MAX_TRIES):
        store.begin_attempt("k", [0])
    ex = FakeExecutor()
    process_chunk("k", chunk(TEXTS[:2]), store, ex)
    assert ex.calls == [[TEXTS[1]]]
    assert store.results("k", 0, 1)[0]["error"]["code"] == "worker_lost"


def test_the_soft_limit_keeps_what_is_done_and_retries_the_rest(store: MemoryJobStore) -> None:
    ex = FakeExecutor(batch_size=4, soft_limit_after=1)
    with pytest.raises(RetryChunk):
        process_chunk("j", chunk(TEXTS), store, ex)
    assert store.state("j").done == 4  # type: ignore[union-attr]
    process_chunk("j", chunk(TEXTS), store, FakeExecutor(batch_size=4))
    assert store.state("j").done == 10  # type: ignore[union-attr]


def test_fail_remaining_only_touches_items_without_results(store: MemoryJobStore) -> None:
    process_chunk("j", chunk(TEXTS[:3]), store, FakeExecutor())
    assert fail_remaining("j", list(range(10)), store, "time_limit", "killed") == 7
    st = store.state("j")
    assert st is not None and (st.done, st.failed) == (3, 7)
    assert store.results("j", 9, 1)[0]["error"] == {"code": "time_limit", "message": "killed", "field": None}


def test_specs_round_trip_to_bulk_requests() -> None:
    from chunlian.offline import compose_request, couplet_request

    for req in (couplet_request("春回大地千山秀", "business", n=3, seed=5),
                compose_request(heads="李明", length=5), compose_request(keyword="新春")):
        back = request_of(spec_of(req))
        assert back.priority == "bulk"
        assert back.identity() == req.identity()
    assert CANCELLED_ENTRY == {"status": "cancelled"}
    with pytest.raises(InvalidInput):
        from chunlian.jobs.items import validate_items

        validate_items([{"upper": "春回大地千山秀"}, {"keyword": "新春快乐吉祥"}])


@pytest.mark.parametrize(("status", "body", "words"), [
    (429, {"error": {"code": "rate_limited", "message": "more than 2 requests/s (burst 10) from this address",
                     "field": None}}, "HTTP 429: rate_limited: more than 2 requests/s"),
    (503, {"error": {"code": "not_ready", "message": "warming up", "field": None}}, "HTTP 503: not_ready: warming up"),
    (502, "<html>bad gateway</html>", "HTTP 502$"),
])
def test_an_engine_url_worker_says_why_the_engine_refused(status: int, body: object, words: str) -> None:
    """The error a chunk is retried for names the refusal (a worker not exempt from nginx's
    per-client rate would otherwise only say 'HTTP 429')."""
    import httpx

    from chunlian.jobs.worker import HttpExecutor

    def answer(_request: httpx.Request) -> httpx.Response:
        return (httpx.Response(status, json=body) if isinstance(body, dict)
                else httpx.Response(status, text=str(body)))

    client = httpx.Client(base_url="http://engine.test", transport=httpx.MockTransport(answer))
    with pytest.raises(RuntimeError, match=words):
        HttpExecutor("http://engine.test", client=client).run([{"upper": "春回大地千山秀"}])


def test_a_batch_failing_mid_way_surfaces_its_own_error_and_frees_its_rows() -> None:
    """The shipped model in a ``LocalExecutor``. A decoding step raising while rows are live
    fails the items in it with a model error naming that exception; a failure outside the
    model step (here the scheduler's) fails every item the core holds the same way. Either
    way the KV cache keeps no rows and the next batch runs."""
    from chunlian.data.blocklist import default_blocklist
    from chunlian.errors import ModelError
    from chunlian.jobs.worker import LocalExecutor
    from chunlian.offline import OfflineGenerator

    gen = OfflineGenerator.load(None, "cpu", capacity=8, blocklist=default_blocklist())
    runner, scheduler = gen.runner, gen.core.scheduler
    real_step, real_plan = runner.step, scheduler.plan
    calls = {"step": 0, "plan": 0}

    def failing_step(specs):  # type: ignore[no-untyped-def]
        calls["step"] += 1
        if calls["step"] == 3:  # after the prefill and a decoding step: rows are live
            assert runner.n_live > 0
            raise RuntimeError("step 3 failed")
        return real_step(specs)

    runner.step = failing_step  # type: ignore[method-assign]
    ex = LocalExecutor(gen, batch_size=4)
    out = ex.run([s for _, s in chunk(TEXTS[:4])])
    assert len(out) == 4 and all(isinstance(o, ModelError) and "RuntimeError" in str(o) for o in out)
    assert runner.n_live == 0 and runner.live_ids() == []

    def failing_plan(now_s: float):  # type: ignore[no-untyped-def]
        calls["plan"] += 1
        if calls["plan"] == 3:
            assert runner.n_live > 0
            raise LookupError("plan 3 failed")
        return real_plan(now_s)

    scheduler.plan = failing_plan  # type: ignore[method-assign]
    out = ex.run([s for _, s in chunk(TEXTS[:4])])
    assert len(out) == 4 and all(isinstance(o, ModelError) and "LookupError" in str(o) for o in out)
    assert runner.n_live == 0 and not gen.core.has_unfinished
    out = ex.run([s for _, s in chunk(TEXTS[4:6])])  # the freed rows serve the next batch
    assert [len(o.best.lower) for o in out if isinstance(o, CoupletResult)] == [7, 7]
