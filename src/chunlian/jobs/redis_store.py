"""Jobs in Redis (Celery mode): the same interface as ``jobs.store.MemoryJobStore``.

Redis layout (``{id}`` is a hash tag, so a job's keys live in one cluster slot)::

    chunlian:job:{id}:meta    hash  total, done, failed, cancelled, created_at,
                                    started_at, finished_at, cancel_requested
    chunlian:job:{id}:results hash  item index -> result entry (JSON); HSETNX only
    chunlian:job:{id}:tries   hash  item index -> times the item was given to the model
    chunlian:jobs:recent      zset  job id -> created at (``recent``; trimmed to the TTL)

Writes go through Lua scripts (atomic: a result and its counter move together, so a
worker killed between the two cannot leave them out of step). Every write refreshes the
keys' TTL (``settings.job_result_ttl_s``), so a job's results expire that long after its
last activity. The first result written for a (job, item) wins (``jobs.store``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from chunlian.jobs.items import CANCELLED, CANCELLED_ENTRY, DONE, FAILED, PENDING, Entry
from chunlian.jobs.store import JobState, outcome_of, page_range

_RECORD = """
-- KEYS: meta, results, tries; ARGV: ttl, now, then (index, outcome, entry) triples
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local written = 0
for i = 3, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 2]) == 1 then
    redis.call('HINCRBY', KEYS[1], ARGV[i + 1], 1)
    written = written + 1
  end
end
if written > 0 and redis.call('HEXISTS', KEYS[1], 'finished_at') == 0 then
  if redis.call('HLEN', KEYS[2]) >= tonumber(redis.call('HGET', KEYS[1], 'total')) then
    redis.call('HSET', KEYS[1], 'finished_at', ARGV[2])
  end
end
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
return written
"""

_CANCEL = """
-- KEYS: meta, results, tries; ARGV: ttl, now, cancelled entry
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HEXISTS', KEYS[1], 'finished_at') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'cancel_requested', '1')
local total = tonumber(redis.call('HGET', KEYS[1], 'total'))
local n = 0
for i = 0, total - 1 do
  if redis.call('HSETNX', KEYS[2], tostring(i), ARGV[3]) == 1 then n = n + 1 end
end
redis.call('HINCRBY', KEYS[1], 'cancelled', n)
redis.call('HSET', KEYS[1], 'finished_at', ARGV[2])
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
return n
"""

_BEGIN = """
-- KEYS: meta, results, tries; ARGV: ttl, now, indices...
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSETNX', KEYS[1], 'started_at', ARGV[2])
local out = {}
for i = 3, #ARGV do out[#out + 1] = redis.call('HINCRBY', KEYS[3], ARGV[i], 1) end
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
return out
"""


_CLAIM = """
-- KEYS: running; ARGV: chunk, stale-before, now. Claim a chunk marked running since before
-- ``stale-before`` (one sweeper wins; the mark moves to now).
local t = redis.call('HGET', KEYS[1], ARGV[1])
if t and tonumber(t) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


# every job's id, scored by its creation time (``recent``): trimmed to the TTL and to a bound
RECENT_KEY = "chunlian:jobs:recent"
MAX_RECENT = 100_000


def job_keys(job_id: str) -> tuple[str, str, str]:
    base = f"chunlian:job:{{{job_id}}}"
    return f"{base}:meta", f"{base}:results", f"{base}:tries"


def chunk_keys(job_id: str) -> tuple[str, str]:
    """Celery mode: the chunks' items (chunk id: its first item index -> ``[[index, spec],
    ...]``) and the chunks running now (chunk id -> since when)."""
    base = f"chunlian:job:{{{job_id}}}"
    return f"{base}:chunks", f"{base}:running"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _state_of(job_id: str, m: Any) -> JobState | None:
    """A job's state from its meta hash (None: no such job, or it expired)."""
    if not m or "total" not in m:
        return None

    def f(name: str) -> float | None:
        return float(m[name]) if name in m else None

    return JobState(
        job_id, int(m["total"]), int(m.get(DONE, 0)), int(m.get(FAILED, 0)),
        int(m.get(CANCELLED, 0)), m.get("cancel_requested") == "1",
        f("created_at") or 0.0, f("started_at"), f("finished_at"),
    )


class RedisJobStore:
    """Jobs in Redis (``redis://`` URL; the broker's Redis in Celery mode)."""

    def __init__(self, url: str, ttl_s: int, client: Any = None) -> None:
        import redis

        self.ttl_s = int(ttl_s)
        self.r = client or redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5,
            health_check_interval=30,
        )
        self._record = self.r.register_script(_RECORD)
        self._cancel = self.r.register_script(_CANCEL)
        self._begin = self.r.register_script(_BEGIN)
        self._claim = self.r.register_script(_CLAIM)

    def create(self, job_id: str, total: int) -> None:
        meta, results, tries = job_keys(job_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(meta, results, tries)
        now = time.time()
        pipe.hset(meta, mapping={"total": total, DONE: 0, FAILED: 0, CANCELLED: 0,
                                 "created_at": repr(now)})
        pipe.expire(meta, self.ttl_s)
        pipe.zadd(RECENT_KEY, {job_id: now})
        pipe.zremrangebyscore(RECENT_KEY, "-inf", now - self.ttl_s)
        pipe.zremrangebyrank(RECENT_KEY, 0, -MAX_RECENT - 1)
        pipe.expire(RECENT_KEY, self.ttl_s)
        pipe.execute()

    def recent(self, limit: int) -> list[JobState]:
        ids = [str(i) for i in self.r.zrevrange(RECENT_KEY, 0, max(0, limit - 1))]
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(job_keys(job_id)[0])
        out: list[JobState] = []
        gone: list[str] = []
        for job_id, meta in zip(ids, pipe.execute(), strict=True):
            st = _state_of(job_id, meta)
            if st is None:  # expired after its last activity: forget it here too
                gone.append(job_id)
            else:
                out.append(st)
        if gone:
            self.r.zrem(RECENT_KEY, *gone)
        return out

    def record(self, job_id: str, results: Sequence[tuple[int, Entry]]) -> int:
        if not results:
            return 0
        args: list[Any] = [self.ttl_s, repr(time.time())]
        for index, entry in results:
            args += [int(index), outcome_of(entry), _dumps(entry)]
        return max(0, int(self._record(keys=job_keys(job_id), args=args)))

    def missing(self, job_id: str, indices: Iterable[int]) -> list[int]:
        idx = list(indices)
        if not idx:
            return []
        have = self.r.hmget(job_keys(job_id)[1], idx)
        return [i for i, v in zip(idx, have, strict=True) if v is None]

    def begin_attempt(self, job_id: str, indices: Sequence[int]) -> dict[int, int]:
        if not indices:
            return {}
        counts = self._begin(keys=job_keys(job_id), args=[self.ttl_s, repr(time.time()), *indices])
        return {i: int(c) for i, c in zip(indices, counts or [], strict=False)}

    def tries(self, job_id: str, indices: Sequence[int] | None = None) -> dict[int, int]:
        key = job_keys(job_id)[2]
        if indices is None:
            return {int(k): int(v) for k, v in self.r.hgetall(key).items()}
        idx = list(indices)
        if not idx:
            return {}
        return {i: int(v) for i, v in zip(idx, self.r.hmget(key, idx), strict=True) if v is not None}

    def is_cancelled(self, job_id: str) -> bool:
        return self.r.hget(job_keys(job_id)[0], "cancel_requested") == "1"

    def cancel(self, job_id: str) -> JobState | None:
        if int(self._cancel(keys=job_keys(job_id),
                            args=[self.ttl_s, repr(time.time()), _dumps(CANCELLED_ENTRY)])) < 0:
            return None
        return self.state(job_id)

    def state(self, job_id: str) -> JobState | None:
        return _state_of(job_id, self.r.hgetall(job_keys(job_id)[0]))

    def total(self, job_id: str) -> int | None:
        v = self.r.hget(job_keys(job_id)[0], "total")
        return None if v is None else int(v)

    def results(self, job_id: str, offset: int, limit: int) -> list[Entry]:
        total = self.total(job_id)
        if total is None:
            return []
        idx = list(page_range(total, offset, limit))
        if not idx:
            return []
        raw = self.r.hmget(job_keys(job_id)[1], idx)
        return [{"index": i, **(json.loads(v) if v is not None else {"status": PENDING})}
                for i, v in zip(idx, raw, strict=True)]

    # ---- Celery mode: chunk bookkeeping, so that a chunk whose message was lost is sent again --
    def save_chunks(self, job_id: str, parts: Sequence[Sequence[Sequence[Any]]]) -> None:
        chunks, _ = chunk_keys(job_id)
        pipe = self.r.pipeline(transaction=False)
        for k in range(0, len(parts), 200):
            pipe.hset(chunks, mapping={str(p[0][0]): _dumps(p) for p in parts[k:k + 200]})
        pipe.expire(chunks, self.ttl_s)
        pipe.execute()

    def chunk_running(self, job_id: str, chunk: int) -> None:
        """A worker has begun the chunk (and holds its message)."""
        _, running = chunk_keys(job_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(running, str(chunk), repr(time.time()))
        pipe.expire(running, self.ttl_s)
        pipe.execute()

    def chunk_left(self, job_id: str, chunk: int, finished: bool) -> None:
        """The worker let go of the chunk: done with it (``finished``), or a retry message
        holds it now."""
        chunks, running = chunk_keys(job_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.hdel(running, str(chunk))
        if finished:
            pipe.hdel(chunks, str(chunk))
        pipe.execute()

    def claim_stalled_chunks(self, job_id: str, older_than_s: float) -> list[list[list[Any]]]:
        """Chunks marked running for longer than ``older_than_s`` (their worker, or their
        message, is gone), claimed by this caller, with their items."""
        chunks, running = chunk_keys(job_id)
        now = time.time()
        stale = [c for c, t in self.r.hgetall(running).items() if float(t) < now - older_than_s]
        out: list[list[list[Any]]] = []
        for c in stale:
            if int(self._claim(keys=[running], args=[c, repr(now - older_than_s), repr(now)])):
                raw = self.r.hget(chunks, c)
                if raw is not None:
                    out.append(json.loads(raw))
        return out

    def delete(self, job_id: str) -> None:
        self.r.delete(*job_keys(job_id), *chunk_keys(job_id))

    def close(self) -> None:
        self.r.close()
