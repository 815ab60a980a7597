"""Prometheus text exposition read back by the load tools: parse, look up, difference."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: [(labels, value), ...]}, label values
    unescaped (``prometheus_client.parser``); ValueError when ``text`` is not an exposition."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    return sum(v for got, v in samples.get(name, ()) if all(got.get(k) == x for k, x in labels.items()))


def cache_counts(samples: Samples) -> tuple[float, float]:
    """(hits over every store, lookups): each request consults the nearest store first, so the
    lookups are those of the busiest store."""
    per_store: dict[str, float] = {}
    hits = 0.0
    for labels, v in samples.get("chunlian_cache_requests_total", ()):
        store = labels.get("store", "")
        per_store[store] = per_store.get(store, 0.0) + v
        if labels.get("result") == "hit":
            hits += v
    return hits, max(per_store.values(), default=0.0)


def metrics_delta(before: Samples, after: Samples, seconds: float) -> dict[str, Any]:
    """What the service did between two scrapes: hit ratio, mean batch, tokens/s, drops."""

    def d(name: str) -> float:
        return metric(after, name) - metric(before, name)

    hits_b, looks_b = cache_counts(before)
    hits_a, looks_a = cache_counts(after)
    looks = looks_a - looks_b
    steps = d("chunlian_engine_batch_size_count")
    return {
        "cache_hit_ratio": round((hits_a - hits_b) / looks, 4) if looks > 0 else None,
        "cache_lookups": int(looks),
        "mean_batch_size": round(d("chunlian_engine_batch_size_sum") / steps, 2) if steps > 0 else None,
        "engine_steps": int(steps),
        "tokens_per_s": round(d("chunlian_generated_tokens_total") / seconds, 1) if seconds > 0 else None,
        "engine_completed": int(d("chunlian_engine_completed_total")),
        "coalesced": int(d("chunlian_coalesced_requests_total")),
        "deadline_drops": int(d("chunlian_deadline_drops_total")),
        "overload_rejections": int(d("chunlian_overload_rejections_total")),
    }
