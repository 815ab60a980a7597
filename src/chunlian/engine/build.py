"""Loading what an engine core runs (``EngineCore.from_config``): the served weights'
runner and 横批 chooser and, for the quality modes, the search weights' runner and the
rescorer of their lines."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chunlian.engine.config import EngineConfig
from chunlian.engine.rerank import HengpiChooser
from chunlian.engine.rescore import Rescorer
from chunlian.engine.runner import ModelRunner, single_threaded_here

log = logging.getLogger("chunlian.engine")


@dataclass(frozen=True)
class CoreParts:
    """A core's models, loaded."""

    runner: ModelRunner
    hengpi: HengpiChooser
    model_tag: str
    rescorer: Rescorer | None = None
    search_runner: ModelRunner | None = None
    search_tag: str | None = None


def load_parts(config: EngineConfig) -> CoreParts:
    """Load the models ``config`` names. Torch runs single-threaded on the calling thread
    until the stepping thread calls ``runner.bind_thread()`` (``ModelRunner.bind_thread``
    says why)."""
    from chunlian.model.checkpoint import QUALITY_WEIGHTS, load_weights
    from chunlian.model.hengpi import HengpiSelector

    single_threaded_here()
    loaded = load_weights(config.model_path, config.device)
    log.info("loaded %s on %s", loaded.tag, config.device)
    runner = ModelRunner(loaded, capacity=config.max_batch_size, device=config.device,
                         threads=config.torch_threads, blocklist=config.blocklist)
    parts = CoreParts(runner, HengpiSelector.from_loaded(loaded), loaded.tag)
    if config.beam_rows == 0:
        return parts
    # the quality modes: the search weights, reranked by both
    searching = load_weights(config.search_model_path or QUALITY_WEIGHTS, config.device)
    log.info("loaded %s on %s for the quality modes", searching.tag, config.device)
    search = ModelRunner(searching, capacity=config.beam_rows, device=config.device,
                         threads=config.torch_threads, blocklist=config.blocklist)
    return CoreParts(runner, parts.hengpi, loaded.tag, Rescorer(searching, (loaded,)), search, searching.tag)
