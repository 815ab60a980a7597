"""``EngineConfig``: the engine's part of the settings, every automatic choice made once,
and checked where it is built."""

from __future__ import annotations

import pytest

from chunlian.config import load_settings
from chunlian.engine.config import EngineConfig


def test_from_settings_takes_the_engine_fields_and_resolves_the_choices() -> None:
    s = load_settings(warmup="", device="cpu", max_batch_size=6, max_queue_size=9, max_wait_ms=2.5,
                      default_timeout_ms=700, batching="static", coalesce=False, bulk_min_share=0.5,
                      min_prefill_seqs=2, engine_nice=3, torch_threads=2, engine_replicas=3)
    c = EngineConfig.from_settings(s)
    assert (c.max_batch_size, c.max_queue_size, c.max_wait_ms, c.default_timeout_ms) == (6, 9, 2.5, 700)
    assert (c.batching, c.coalesce, c.bulk_min_share, c.min_prefill_seqs) == ("static", False, 0.5, 2)
    assert (c.engine_nice, c.device, c.torch_threads, c.replicas, c.replica_threads) == (3, "cpu", 2, 3, 2)
    assert c.in_child and c.model_path is None and c.blocklist is not None
    auto = EngineConfig.from_settings(load_settings(warmup="", device="auto", engine_replicas=1))
    assert auto.device in ("cpu", "cuda") and not auto.in_child and auto.torch_threads >= 1


@pytest.mark.parametrize("bad", [
    {"max_batch_size": 0}, {"max_queue_size": 0}, {"max_wait_ms": -1.0}, {"default_timeout_ms": 0},
    {"batching": "dynamic"}, {"bulk_min_share": 1.5}, {"min_prefill_seqs": -1}, {"engine_nice": 20},
    {"device": "auto"}, {"torch_threads": -1}, {"replicas": 0}, {"replicas": 5, "max_batch_size": 4},
])
def test_a_bad_value_is_refused_where_the_config_is_built(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**bad)
