"""Fake model runners for engine tests: no torch, deterministic, step-controlled."""

from __future__ import annotations

import os
import threading

from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine
from chunlian.engine.request import SeqOutput, SeqSpec


class FakeRunner:
    """Each sequence emits ``spec.total_steps`` tokens, then finishes with a fixed lower line.

    ``gate``: when set, every step waits for it (lets a test hold the engine mid-step).
    ``fail_on``: an upper line whose presence in a step makes that step raise.
    """

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self.tokens_emitted = 0
        self.padded_batches = False  # set by the engine; the fake's steps ignore it
        self.live: dict[int, tuple[SeqSpec, int]] = {}
        self.prefilled: list[int] = []
        self.released: list[int] = []
        self.batch_sizes: list[int] = []
        self.steps_fused = 0
        self.gate: threading.Event | None = None
        self.fail_on: str | None = None
        self.bound_thread: str | None = None
        self.bound_nice: int | None = None

    def bind_thread(self) -> None:
        self.bound_thread = threading.current_thread().name
        self.bound_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def _wait(self) -> None:
        if self.gate is not None:
            self.gate.wait(timeout=30)

    def _check(self) -> None:
        if self.fail_on is not None and any(s.upper == self.fail_on for s, _ in self.live.values()):
            raise RuntimeError("boom")

    def step(self, specs: list[SeqSpec]) -> list[SeqOutput]:
        """One iteration (``ModelRunner.step``): the live rows advance a token and ``specs``
        are admitted with their first one; ``steps_fused`` counts calls that did both."""
        old = list(self.live)
        assert len(old) + len(specs) <= self.capacity
        for s in specs:
            self.live[s.seq_id] = (s, 0)
            self.prefilled.append(s.seq_id)
        self.steps_fused += bool(old and specs)
        self._wait()
        self._check()
        self.batch_sizes.append(len(self.live))
        return self._advance(old + [s.seq_id for s in specs])

    def _advance(self, ids: list[int]) -> list[SeqOutput]:
        out = []
        for i in ids:
            spec, done = self.live[i]
            done += 1
            self.tokens_emitted += 1
            if done >= spec.total_steps:
                del self.live[i]
                upper = spec.upper or "甲" * spec.upper_len
                out.append(SeqOutput(i, upper, "乙" * spec.upper_len, -1.0 - 0.01 * (i % 7)))
            else:
                self.live[i] = (spec, done)
        return out

    def release(self, seq_ids: set[int] | list[int]) -> None:
        for i in seq_ids:
            if i in self.live:
                del self.live[i]
                self.released.append(i)


def small_fake_engine() -> tuple[Engine, FakeRunner]:
    """An in-process engine of 4 rows and an 8-request queue over a ``FakeRunner``."""
    config = EngineConfig(max_batch_size=4, max_wait_ms=0, max_queue_size=8)
    runner = FakeRunner(capacity=4)
    return Engine(config, runner, None, "fake@1"), runner
