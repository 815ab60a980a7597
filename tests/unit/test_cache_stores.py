"""Cache stores, keys, values and the store chain (no network except a refused port)."""

from __future__ import annotations

import logging

import pytest

from chunlian.cache import CacheUnavailable, MemoryStore, RedisStore, ResultCache, cache_key
from chunlian.cache.codec import decode_result, encode_result
from chunlian.types import BeamParams, Couplet, CoupletRequest, CoupletResult, DecodeParams


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def result(lower: str = "福满人间万户春") -> CoupletResult:
    best = Couplet("春回大地千山秀", lower, "万象更新", "traditional", score=-1.5)
    return CoupletResult(best=best, candidates=(best,), model="m@1")


async def test_memory_lru_evicts_least_recently_used() -> None:
    s = MemoryStore(2)
    await s.set("a", "1", 60)
    await s.set("b", "2", 60)
    assert await s.get("a") == "1"  # a is now the most recent
    await s.set("c", "3", 60)
    assert await s.get("b") is None
    assert (await s.get("a"), await s.get("c")) == ("1", "3")
    assert len(s) == 2


async def test_memory_ttl_expires() -> None:
    clock = Clock()
    s = MemoryStore(10, clock=clock)
    await s.set("k", "v", 5)
    clock.t += 4.9
    assert await s.get("k") == "v"
    clock.t += 0.2
    assert await s.get("k") is None
    assert len(s) == 0


async def test_memory_size_zero_keeps_nothing() -> None:
    s = MemoryStore(0)
    await s.set("k", "v", 5)
    assert await s.get("k") is None
    with pytest.raises(ValueError):
        MemoryStore(-1)


def test_key_is_prefixed_hash_without_user_text() -> None:
    req = CoupletRequest(upper="春回大地千山秀")
    k = cache_key("m@1", req)
    assert k.startswith("chunlian:v1:") and len(k) == len("chunlian:v1:") + 64
    assert "春" not in k
    assert k == cache_key("m@1", CoupletRequest(upper="春回大地千山秀"))


def test_key_covers_everything_that_changes_the_answer() -> None:
    base = CoupletRequest(upper="春回大地千山秀")
    variants = [
        CoupletRequest(upper="春回大地千山绿"),
        CoupletRequest(upper="春回大地千山秀", style="business"),
        CoupletRequest(upper="春回大地千山秀", params=DecodeParams(seed=1)),
        CoupletRequest(upper="春回大地千山秀", params=DecodeParams(seed=2)),
        CoupletRequest(upper="春回大地千山秀", params=DecodeParams(n=3)),
        CoupletRequest(upper="春回大地千山秀", params=DecodeParams(seed=1, temperature=0.5)),
        CoupletRequest(keyword="春回", length=7),
        CoupletRequest(keyword="春回", length=5),
        CoupletRequest(heads="春回", length=7),
    ]
    keys = {cache_key("m@1", r) for r in [base, *variants]}
    assert len(keys) == len(variants) + 1
    assert cache_key("m@2", base) != cache_key("m@1", base)


def test_key_ignores_what_does_not_change_the_answer() -> None:
    base = CoupletRequest(upper="春回大地千山秀")
    same = [
        CoupletRequest(upper="春回大地千山秀", params=DecodeParams(temperature=0.3)),  # greedy
        CoupletRequest(upper="春回大地千山秀", priority="bulk", timeout_s=1.0),
    ]
    assert {cache_key("m@1", r) for r in same} == {cache_key("m@1", base)}


def test_codec_round_trip_and_malformed() -> None:
    r = result()
    assert decode_result(encode_result(r)) == r
    for bad in ("", "{}", "[1]", '{"best": {"upper": 1}}', "not json"):
        with pytest.raises(ValueError):
            decode_result(bad)


class BrokenStore:
    name = "broken"

    async def get(self, key: str) -> str | None:
        raise CacheUnavailable("down")

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        raise CacheUnavailable("down")

    async def close(self) -> None:
        pass


async def test_chain_backfills_nearer_stores_and_reports_lookups() -> None:
    near, far = MemoryStore(10), MemoryStore(10)
    far_named = _Renamed(far, "far")
    seen: list[tuple[str, str]] = []
    cache = ResultCache([near, far_named], ttl_s=60, on_lookup=lambda s, r: seen.append((s, r)))
    assert await cache.get("k") is None
    assert seen == [("memory", "miss"), ("far", "miss")]
    await far.set("k", encode_result(result()), 60)
    seen.clear()
    assert await cache.get("k") == result()
    assert seen == [("memory", "miss"), ("far", "hit")]
    seen.clear()
    assert await cache.get("k") == result()  # now served by the near store
    assert seen == [("memory", "hit")]


async def test_chain_bypasses_a_failing_store() -> None:
    seen: list[tuple[str, str]] = []
    mem = MemoryStore(10)
    cache = ResultCache([BrokenStore(), mem], ttl_s=60, on_lookup=lambda s, r: seen.append((s, r)))
    await cache.put("k", result())  # the broken store is skipped, memory still written
    assert await cache.get("k") == result()
    assert seen == [("broken", "error"), ("memory", "hit")]


async def test_chain_treats_a_malformed_entry_as_an_error() -> None:
    mem = MemoryStore(10)
    await mem.set("k", "{garbage", 60)
    seen: list[tuple[str, str]] = []
    cache = ResultCache([mem], ttl_s=60, on_lookup=lambda s, r: seen.append((s, r)))
    assert await cache.get("k") is None
    assert seen == [("memory", "error")]


class _Renamed:
    def __init__(self, inner: MemoryStore, name: str) -> None:
        self.inner, self.name = inner, name

    async def get(self, key: str) -> str | None:
        return await self.inner.get(key)

    async def set(self, key: str, value: str, ttl_s: int) -> None:
        await self.inner.set(key, value, ttl_s)

    async def close(self) -> None:
        await self.inner.close()


async def test_redis_store_down_bypasses_fast_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    states: list[bool] = []
    # port 9 (discard) is closed on loopback: connection refused at once
    store = RedisStore("redis://127.0.0.1:9/15", retry_interval_s=60.0, on_state_change=states.append)
    caplog.set_level(logging.INFO, logger="chunlian.cache.redis")
    try:
        assert store.up
        with pytest.raises(CacheUnavailable):
            await store.get("k")
        assert not store.up and states == [False]
        calls: list[str] = []
        real = store._client

        class Spy:
            def __getattr__(self, name: str) -> object:
                calls.append(name)
                return getattr(real, name)

        store._client = Spy()  # type: ignore[assignment]
        for _ in range(50):
            with pytest.raises(CacheUnavailable):
                await store.get("k")
            with pytest.raises(CacheUnavailable):
                await store.set("k", "v", 10)
        assert calls == []  # bypassed: no Redis command while down
        store._client = real
        assert states == [False]
        lines = [r for r in caplog.records if r.name == "chunlian.cache.redis"]
        assert len(lines) == 1 and "unreachable" in lines[0].getMessage()
        assert not await store.check()
    finally:
        await store.close()


def test_redis_store_never_logs_the_password() -> None:
    store = RedisStore("redis://user:hunter2@127.0.0.1:9/0")
    assert "hunter2" not in store.url


def test_decode_params_as_dict_holds_every_field() -> None:
    """Cache keys and coalescing hash ``DecodeParams.as_dict()``: a field missing from it
    would make requests that differ in it share an answer."""
    from dataclasses import asdict, fields

    p = DecodeParams(n=3, seed=7, temperature=0.5, top_k=9, top_p=0.5)
    assert p.as_dict() == asdict(p)
    assert set(p.as_dict()) == {f.name for f in fields(DecodeParams)}
    beamed = DecodeParams(n=2, beam=BeamParams(8, 0.5, 0.25))
    assert beamed.as_dict() == asdict(beamed)


def test_beam_requests_key_on_their_search_not_their_seed() -> None:
    """A beam answer is deterministic: seed and sampling parameters never split its key,
    and every search parameter does; greedy and sampled keys read as they do without beams."""
    def key(**kw: object) -> str:
        return cache_key("m@1", CoupletRequest(upper="春回大地", params=DecodeParams(**kw)))  # type: ignore[arg-type]

    assert key(beam=BeamParams(8)) == key(beam=BeamParams(8), seed=3, temperature=0.1)
    assert len({key(beam=BeamParams(8)), key(beam=BeamParams(16)), key(beam=BeamParams(8, 0.5)),
                key(beam=BeamParams(8, 0.0, 0.5)), key(n=2, beam=BeamParams(8)), key()}) == 6
    assert key(seed=5) != key(seed=5, beam=BeamParams(8))
