"""``chunlian bench engine``: the shipped model offline, three batching modes side by side.

All modes run in one process, one after another, on the same fixed mix of real upper
lines (5 to 12+ characters, ``resources/sample_uppers.txt``), through the real ``Engine``
(scheduler, engine thread, runner). Every request is submitted at once, so throughput is
the engine's drain rate: sequences finished per second of wall time.

* sequential: ``max_batch_size = 1`` (no batching)
* static: request-level batching (``batching = "static"``, the seeds' baseline): a batch
  is one padded rectangle - one prefill padded to its longest prompt, every row decoded
  until the longest finishes - and runs to completion before the next is admitted
* static_retire (reported beside it, not a setting): static admission, but finished rows
  leave the decode forward at once and the prefill is grouped by length - a stronger
  static baseline, which isolates what admission at every step alone buys
* continuous: iteration-level batching; finished sequences leave and waiting ones join at
  every step
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunlian.bench.common import percentile
from chunlian.bench.engine_report import MODES, rates, replica_rates
from chunlian.config import load_settings
from chunlian.data.samples import sample_uppers
from chunlian.engine.config import EngineConfig
from chunlian.engine.engine import Engine
from chunlian.engine.runner import ModelRunner
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.types import CoupletRequest, DecodeParams


def mixed_lines(requests: int) -> list[str]:
    """The fixed mix: the sample lines, then longer two-clause lines built from them.

    Every line is distinct (repeated lines would be coalesced and flatter the figures): the
    ``c``-th pass over the pool appends a second clause from companion ``i * 7 + c - 1``, so
    passes never repeat one another (the first 800 lines are the long-standing mix, so figures stay comparable)."""
    pool = sample_uppers()
    n = len(pool)
    mix = [pool[i % n] if i < n else pool[i % n] + "，" + pool[(i * 7 + i // n - 1) % n][:5]
           for i in range(requests)]
    return [u[:32].rstrip("，") for u in mix]


def length_sample(mix: list[str], count: int) -> list[str]:
    """``count`` lines spread evenly over ``mix`` sorted by length (the middle of each of
    ``count`` equal strata): the same length mix as the whole, for the slow sequential run."""
    if count >= len(mix):
        return list(mix)
    ordered = sorted(mix, key=len)
    return [ordered[(2 * i + 1) * len(ordered) // (2 * count)] for i in range(count)]


def _mean_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Field-wise mean of several runs of one mode."""
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def _mean_chars(lines: list[str]) -> float:
    return round(sum(map(len, lines)) / max(1, len(lines)), 2)


def steady_rate(latencies_s: list[float], lo: float = 0.1, hi: float = 0.9) -> float:
    """Completions per second between the ``lo`` and ``hi`` shares of requests done, for
    requests all submitted at one instant (a latency is then a completion time). All at once,
    the first answers wait for a full batch's prompts and the last ones run in a draining
    batch; the middle of the run is the engine at its steady peak (0 when too few)."""
    done = sorted(latencies_s)
    a, b = int(lo * len(done)), int(hi * len(done)) - 1
    if b <= a or done[b] <= done[a]:
        return 0.0
    return (b - a) / (done[b] - done[a])


async def _drive(loaded: LoadedModel, uppers: list[str] | list[CoupletRequest], batch: int, mode: str,
                 hengpi: Any, threads: int = 0, one_at_a_time: bool = False) -> dict[str, float]:
    batching = "static" if mode == "static_retire" else mode
    config = EngineConfig.from_settings(load_settings(
        max_batch_size=batch, batching=batching, max_wait_ms=0, max_queue_size=max(len(uppers), 1),
        default_timeout_ms=600_000))
    # the service's bans on generated text (safety and zodiac terms), as the engine it
    # stands for applies them
    runner = ModelRunner(loaded, capacity=batch, threads=threads, blocklist=config.blocklist)
    engine = Engine(config, runner, hengpi, loaded.tag)
    if mode == "static_retire":
        runner.padded_batches = False  # static admission, rows retired at once
    await engine.start()
    lat: list[float] = []

    async def one(u: str | CoupletRequest) -> None:
        t = time.perf_counter()
        await engine.generate(u if isinstance(u, CoupletRequest) else CoupletRequest(upper=u))
        lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    if one_at_a_time:  # each request alone in the engine: its latency is the model's, no queue
        for u in uppers:
            await one(u)
    else:
        await asyncio.gather(*(one(u) for u in uppers))
    wall = time.perf_counter() - t0
    await engine.stop()
    steps = engine.stats.steps_total
    return {
        "seq_per_s": len(uppers) / wall,
        "steady_seq_per_s": steady_rate(lat),
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "wall_s": wall,
        "mean_batch": engine.stats.tokens_total / max(steps, 1),
    }


@dataclass(frozen=True)
class _Bench:
    """One loaded model, driven through a fresh engine per run (``_drive``)."""

    loaded: LoadedModel
    hengpi: Any
    threads: int

    def drive(self, lines: list[str], batch: int, mode: str) -> dict[str, float]:
        return asyncio.run(_drive(self.loaded, lines, batch, mode, self.hengpi, self.threads))


@dataclass
class _Runs:
    """Every measured run of ``run``, by mode."""

    sequential: list[dict[str, float]] = field(default_factory=list)
    modes: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {m: [] for m in MODES})
    replicas: list[dict[str, Any]] = field(default_factory=list)


def run(
    model_path: Path | None = None, max_batch_size: int = 128, requests: int = 400,
    sequential_requests: int = 100, threads: int = 2, sweep: list[int] | None = None,
    device: str = "cpu", rounds: int = 2, replicas: int = 1,
) -> dict[str, Any]:
    """Run the three modes (and an optional batch-size sweep); return one flat report.

    Static and continuous run ``rounds`` times, alternating which goes first, and the
    figures are their means; sequential runs a slice of its sample before and after each.
    The host's speed drifts within a run, and modes measured one after the other once
    carry that drift into their ratio. ``replicas`` > 1 adds ``continuous_replicas``: that many
    single-engine processes side by side (``engine.replicas``, the service's layout on a
    multi-core CPU), each with ``threads // replicas`` threads and its share of the rows, in
    every round after the other modes.
    """
    from chunlian.engine.runner import single_threaded_here
    from chunlian.model.hengpi import HengpiSelector

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    single_threaded_here()  # the engine threads get ``threads`` (ModelRunner.bind_thread)
    loaded = load_weights(model_path, device)
    bench = _Bench(loaded, HengpiSelector.from_loaded(loaded), threads)
    mix = mixed_lines(requests)
    # the sequential run is slow, so it takes a sample - with the mix's length distribution
    # (the mix's first lines are its short ones: taking those flattered sequential)
    seq_mix = length_sample(mix, sequential_requests)
    bench.drive(mix[:16], min(16, max_batch_size), "continuous")  # warm-up
    peak_path = str(model_path) if model_path else None
    runs = _rounds(bench, mix, seq_mix, max_batch_size, rounds, replicas, peak_path)
    means = _means(runs, len(seq_mix))
    report: dict[str, Any] = {
        "model": loaded.tag, "requests": len(mix), "sequential_requests": len(seq_mix),
        "mean_chars": _mean_chars(mix), "sequential_mean_chars": _mean_chars(seq_mix),
        "max_batch_size": max_batch_size, "torch_threads": threads, "rounds": rounds,
        **rates(runs.modes, means),
    }
    if runs.replicas:
        report.update(replica_rates(runs.replicas, replicas, means))
    if sweep:
        report["sweep"] = _sweep(bench, sweep, mix, seq_mix)
    return report


def _rounds(bench: _Bench, mix: list[str], seq_mix: list[str], max_batch_size: int, rounds: int,
            replicas: int, model_path: str | None) -> _Runs:
    """The batched modes ``rounds`` times, alternating their order. Sequential: its sample
    cut into strata of the same length mix, one run before each batched run and one after
    the last, so that drift of the host's speed (a shared host's can move by nearly a third
    within a minute: ``docs/performance.md``) falls on every mode alike. The replicas' peak
    comes after the other modes in every round."""
    runs = _Runs()
    k = rounds * (len(MODES) + (replicas > 1)) + 1
    slices = [h for h in (seq_mix[i::k] for i in range(k)) if h]

    def sequential_slice() -> None:
        if slices:
            runs.sequential.append(bench.drive(slices.pop(0), 1, "continuous"))

    sequential_slice()
    for i in range(rounds):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            runs.modes[mode].append(bench.drive(mix, max_batch_size, mode))
            sequential_slice()
        if replicas > 1:
            runs.replicas.append(replicated_peak(model_path, max_batch_size, len(mix), replicas,
                                                 max(1, bench.threads // replicas), "mixed"))
            sequential_slice()
    while slices:
        sequential_slice()
    return runs


def _means(runs: _Runs, sequential_requests: int) -> dict[str, dict[str, float]]:
    """Each mode's mean run; sequential's rate is over its whole sample."""
    seq = _mean_run(runs.sequential)
    seq["seq_per_s"] = sequential_requests / sum(r["wall_s"] for r in runs.sequential)
    return {"sequential": seq, **{m: _mean_run(runs.modes[m]) for m in MODES}}


def _sweep(bench: _Bench, sweep: list[int], mix: list[str], seq_mix: list[str]) -> list[dict[str, Any]]:
    """Continuous batching at each of ``sweep``'s batch sizes (1: on the sequential sample)."""
    table = []
    for b in sweep:
        lines = seq_mix if b == 1 else mix
        point = bench.drive(lines, b, "continuous")
        table.append({"max_batch_size": b, "seq_per_s": round(point["seq_per_s"], 1),
                      "p50_ms": round(point["p50_ms"], 1), "p99_ms": round(point["p99_ms"], 1),
                      "requests": len(lines)})
    return table


def http_requests(count: int, seeded_share: float = 0.0) -> list[CoupletRequest]:
    """``count`` fresh requests of ``chunlian bench http``'s plan (same lines, styles, seeds):
    its greedy ones first in the plan's order, and a ``seeded_share`` of seeded (sampled)
    ones spread evenly among them. A long run of the load tester sends seeded requests once
    its greedy ones are used up (``RequestPlan.unique_body``), and a sampled row costs a step
    more than a greedy one, so the offline peak it is compared with gets the same mix."""
    from chunlian.bench.plan import RequestPlan, load_lines

    if not 0.0 <= seeded_share <= 1.0:
        raise ValueError(f"seeded_share must be within 0..1, got {seeded_share}")
    plan = RequestPlan(load_lines(), unique_ratio=1.0)
    want_seeded = round(count * seeded_share)
    greedy: list[CoupletRequest] = []
    seeded: list[CoupletRequest] = []
    while len(greedy) < count - want_seeded or len(seeded) < want_seeded:
        b = plan.next_body()
        if "seed" not in b:
            greedy.append(CoupletRequest(upper=b["upper"], style=b["style"]))
        elif len(seeded) < want_seeded:
            seeded.append(CoupletRequest(upper=b["upper"], style=b["style"],
                                         params=DecodeParams(seed=b["seed"])))
        elif plan.sent_unique > plan.greedy_pool:  # every greedy request has been drawn
            break
    out: list[CoupletRequest] = []
    g = s = 0
    for i in range(count):  # spread evenly: of the first i + 1, round((i + 1) * share) are seeded
        if s < len(seeded) and round((i + 1) * seeded_share) > s:
            out.append(seeded[s])
            s += 1
        elif g < len(greedy):
            out.append(greedy[g])
            g += 1
    return out


def peak(model_path: str | None, max_batch_size: int, requests: int, threads: int,
         workload: str = "mixed", seeded_share: float = 0.0,
         part: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Continuous batching only, all ``requests`` submitted at once (the engine's peak), on
    the fixed mix (``mixed``) or on the HTTP load tester's requests (``http``).
    ``seq_per_s`` over the whole run; ``steady_seq_per_s`` between 10% and 90% done
    (``steady_rate``: without the filling and the draining batch). ``part`` ``(i, n)``: run
    every n-th request from the i-th (one of n replicas side by side: ``replicated_peak``)."""
    from chunlian.engine.runner import single_threaded_here
    from chunlian.model.hengpi import HengpiSelector

    single_threaded_here()  # the engine thread gets ``threads`` (ModelRunner.bind_thread)
    loaded = load_weights(Path(model_path) if model_path else None, "cpu")
    hengpi = HengpiSelector.from_loaded(loaded)
    mix: list[str] | list[CoupletRequest] = (
        http_requests(requests, seeded_share) if workload == "http" else mixed_lines(requests))
    mix = mix[part[0]::part[1]]
    warm = min(16, max_batch_size)
    asyncio.run(_drive(loaded, mix[:16], warm, "continuous", hengpi, threads))  # warm-up
    r = asyncio.run(_drive(loaded, mix, max_batch_size, "continuous", hengpi, threads))
    return {"seq_per_s": round(r["seq_per_s"], 1), "steady_seq_per_s": round(r["steady_seq_per_s"], 1),
            "p50_ms": round(r["p50_ms"], 1),
            "threads": threads, "max_batch_size": max_batch_size, "requests": len(mix),
            "workload": workload,
            "seeded_share": round(sum(not isinstance(m, str) and not m.params.greedy for m in mix) / len(mix), 3)}


def replicated_peak(model_path: str | None, max_batch_size: int, requests: int, replicas: int,
                    threads: int, workload: str = "mixed",
                    seeded_share: float = 0.0) -> dict[str, Any]:
    """``peak`` of ``replicas`` engines side by side, each in its own process with
    ``threads`` torch threads and its share of the rows and of the requests (as
    ``engine.replicas`` splits them): the sum of their rates. Child i runs every
    ``replicas``-th request of the same list from the i-th, so each sees the whole mix."""
    import json
    import subprocess
    import sys

    from chunlian.engine.replicas import share

    procs = []
    for i in range(replicas):
        code = (
            "import json\n"
            "from chunlian.bench.engine import peak\n"
            f"print(json.dumps(peak({model_path!r}, {share(max_batch_size, replicas, i)}, "
            f"{requests}, {threads}, {workload!r}, "
            f"seeded_share={seeded_share!r}, part=({i}, {replicas}))))\n"
        )
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True))
    parts = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode:
            raise RuntimeError(f"a replica's peak failed (exit {p.returncode})")
        parts.append(json.loads(out.strip().splitlines()[-1]))
    return {"seq_per_s": round(sum(x["seq_per_s"] for x in parts), 1),
            "steady_seq_per_s": round(sum(x["steady_seq_per_s"] for x in parts), 1),
            "replicas": replicas, "threads": threads, "max_batch_size": max_batch_size,
            "requests": sum(x["requests"] for x in parts), "workload": workload,
            "seeded_share": seeded_share,
            "by_replica_steady_seq_per_s": [x["steady_seq_per_s"] for x in parts]}



def compare_weights(
    paths: list[Path | None], max_batch_size: int = 64, requests: int = 400, sequential_requests: int = 60,
    threads: int = 2, device: str = "cpu", rounds: int = 2,
) -> dict[str, Any]:
    """Two or more weight files on one host, side by side: continuous batching at
    ``max_batch_size`` (couplets/s) and requests sent one after the other, each alone in the
    engine (latency), each round in an
    alternating order of the weights, so the host's drift falls on each alike. Ratios are
    against the first weights."""
    from chunlian.engine.runner import single_threaded_here
    from chunlian.model.hengpi import HengpiSelector

    if rounds < 1 or len(paths) < 2:
        raise ValueError("compare_weights needs two weight files or more and rounds >= 1")
    single_threaded_here()
    models = [load_weights(p, device) for p in paths]
    tags = [m.tag for m in models]
    names = [t if tags.count(t) == 1 else f"{t} #{i + 1}" for i, t in enumerate(tags)]
    hengpis = [HengpiSelector.from_loaded(m) for m in models]
    mix = mixed_lines(requests)
    lone = length_sample(mix, sequential_requests)
    batched: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    single: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for i, m in enumerate(models):  # warm-up: first-call allocations stay out of the figures
        asyncio.run(_drive(m, mix[:16], min(16, max_batch_size), "continuous", hengpis[i], threads))
    for r in range(rounds):
        order = list(range(len(models)))
        for i in order if r % 2 == 0 else order[::-1]:
            batched[names[i]].append(asyncio.run(_drive(models[i], mix, max_batch_size, "continuous",
                                                        hengpis[i], threads)))
            single[names[i]].append(asyncio.run(_drive(models[i], lone[r::rounds], 1, "continuous",
                                                       hengpis[i], threads, one_at_a_time=True)))
    out: dict[str, Any] = {"requests": len(mix), "lone_requests": len(lone), "max_batch_size": max_batch_size,
                           "torch_threads": threads, "rounds": rounds, "models": {}}
    for n, m in zip(names, models, strict=True):
        b, s = _mean_run(batched[n]), _mean_run(single[n])
        out["models"][n] = {
            "params": m.model.num_params(),
            "batch_seq_per_s": round(b["seq_per_s"], 1),
            "batch_p99_ms": round(b["p99_ms"], 1),
            "lone_p50_ms": round(s["p50_ms"], 1),
            "lone_p99_ms": round(s["p99_ms"], 1),
            "batch_seq_per_s_by_round": [round(x["seq_per_s"], 1) for x in batched[n]],
        }
    first = out["models"][names[0]]
    for n in names[1:]:
        cur = out["models"][n]
        cur["ratio_batch_seq_per_s_vs_first"] = round(cur["batch_seq_per_s"] / first["batch_seq_per_s"], 2)
        cur["ratio_lone_p50_vs_first"] = round(cur["lone_p50_ms"] / first["lone_p50_ms"], 2)
    return out
