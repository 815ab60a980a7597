"""The ``chunlian`` command line.

Model and service commands live here; the jobs, cluster and bench areas keep their
sub-commands beside their code (``jobs.cli``, ``cluster.cli``, ``bench.cli``), each
registered explicitly by ``build_parser``. Shared flags and types: ``chunlian.cliargs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chunlian.bench import cli as bench_cli
from chunlian.cliargs import (
    Parser,
    add_device,
    add_log_level,
    add_no_progress,
    dump,
    fail,
    whole_number,
)
from chunlian.cluster import cli as cluster_cli
from chunlian.errors import ChunlianError, ConfigError, InvalidInput
from chunlian.jobs import cli as jobs_cli
from chunlian.training import cli as training_cli


def _result_obj(res: Any) -> dict[str, Any]:
    out: dict[str, Any] = res.best.as_dict()
    if res.candidates:
        out["candidates"] = [c.as_dict() for c in res.candidates]
    return out


def _print_result(res: Any, as_json: bool) -> None:
    if as_json:
        dump(_result_obj(res))
        return
    b = res.best
    print(f"横批  {b.hengpi}\n上联  {b.upper}\n下联  {b.lower}")
    for i, c in enumerate(res.candidates[1:], start=2):
        print(f"  #{i} {c.upper} / {c.lower}  [{c.hengpi}]")


def _apply_quality(args: argparse.Namespace) -> None:
    """Resolve the search flags: ``--quality`` fills in the preset's weights, beam, channel
    weight and rescoring (the shipped weights, at the preset's weight), each unless given
    (an explicit ``--model-path``, ``--beam``, ``--channel`` or ``--rescore[-weight]``
    wins; ``--quality --beam 1`` is greedy on the quality weights, with no channel or
    rescoring term unless asked for, which then needs a beam). ``--rescore`` alone takes
    the preset's weight."""
    from chunlian.offline import QUALITY

    if getattr(args, "quality", False):
        from chunlian.model.checkpoint import DEFAULT_WEIGHTS, QUALITY_WEIGHTS

        if args.model_path is None:
            args.model_path = QUALITY_WEIGHTS
        if args.beam is None:
            args.beam = QUALITY.width
        if args.channel is None and args.beam > 1:
            args.channel = QUALITY.channel_weight
        if args.rescore is None and (args.beam > 1 or args.rescore_weight):
            args.rescore = [DEFAULT_WEIGHTS]
    if args.beam is None:
        args.beam = 1
    if args.channel is None:
        args.channel = 0.0
    if args.rescore_weight is None:
        args.rescore_weight = QUALITY.rescore_weight if args.rescore else 0.0
    # the preset's search reranks its best lines only
    args.rescore_top = QUALITY.rescore_top if getattr(args, "quality", False) and args.beam == QUALITY.width else 0


def _generator(args: argparse.Namespace) -> Any:
    from chunlian.config import load_settings
    from chunlian.offline import OfflineGenerator

    return OfflineGenerator.load(
        args.model_path, args.device, capacity=args.batch_size, beam_width=getattr(args, "beam", 1),
        blocklist=load_settings().generation_blocklist(),  # the bans the service applies
        channel_weight=getattr(args, "channel", 0.0),
        rescore=tuple(getattr(args, "rescore", None) or ()), rescore_weight=getattr(args, "rescore_weight", 0.0),
        rescore_top=getattr(args, "rescore_top", 0),
    )


# ---- model commands --------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from chunlian.offline import check_beam, check_channel, check_rescore, couplet_request

    _apply_quality(args)
    try:
        check_beam(args.beam)
        check_channel(args.channel, args.beam)
        check_rescore(args.rescore_weight, args.beam, len(args.rescore or ()))
    except InvalidInput as e:
        return fail(e.message)
    if args.file is None:
        if not args.upper:
            return fail("give an upper line or --file")
        try:
            req = couplet_request(args.upper, args.style, args.n, args.seed)
        except InvalidInput as e:
            return fail(e.message)
        (res,) = _generator(args).generate([req])
        if isinstance(res, ChunlianError):
            return fail(str(res))
        _print_result(res, args.json)
        return 0
    try:
        from chunlian.offline import check_n, check_style

        check_style(args.style)
        check_n(args.n)
    except InvalidInput as e:
        return fail(e.message)
    lines = Path(args.file).read_text(encoding="utf-8").splitlines()
    if lines and lines[0].split("\t")[0].strip() == "upper":
        lines = lines[1:]
    slots: list[Any] = []
    reqs = []
    for line in lines:
        try:
            reqs.append(couplet_request(line.split("\t")[0], args.style, args.n, args.seed))
            slots.append(None)
        except InvalidInput as e:
            slots.append({"upper": line, "error": e.message})
    results = iter(_generator(args).generate(reqs)) if reqs else iter(())
    for slot in slots:
        if slot is not None:
            dump(slot) if args.json else print(f"error: {slot['error']}")
            continue
        res = next(results)
        if isinstance(res, ChunlianError):
            dump({"error": str(res)})
        else:
            _print_result(res, args.json)
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from chunlian.offline import compose_request

    _apply_quality(args)
    try:
        # --quality: the 上联 searched under its head, then answered by the search (engine.composed)
        req = compose_request(args.heads, args.keyword, args.length, args.style, args.n, args.seed,
                              quality="best" if args.quality else "fast")
    except InvalidInput as e:
        return fail(e.message)
    (res,) = _generator(args).generate([req])
    if isinstance(res, ChunlianError):
        return fail(str(res))
    _print_result(res, args.json)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from chunlian.training.eval_run import run_eval
    from chunlian.training.evaluate import EVAL_EXTRA, can_score

    if not can_score():
        return fail(EVAL_EXTRA)
    _apply_quality(args)
    try:
        report = run_eval(Path(args.data), args.limit, args.model_path, args.device, args.baselines,
                          args.batch_size, args.tone_bias, args.beam, args.zodiac_year,
                          args.channel, tuple(args.rescore or ()),
                          args.rescore_weight, args.rescore_top)
    except InvalidInput as e:
        return fail(e.message)
    if args.json:
        dump(report)
    else:
        for k, v in report.items():
            for name, value in (v.items() if isinstance(v, dict) else [("", v)]):
                print(f"{(k + ' ' + str(name)).strip():28s} {value}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from chunlian.api import serve
    from chunlian.config import load_settings

    overrides = {k: getattr(args, k) for k in ("host", "port", "model_path", "device", "max_batch_size",
                                                "max_wait_ms", "max_queue_size", "redis_url", "batching",
                                                "log_level", "torch_threads", "engine_replicas")}
    serve(load_settings(**overrides))
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    import asyncio

    from chunlian.api.warmup import read_warmup_file, warmup_remote
    from chunlian.config import DEFAULT_WARMUP, load_client_settings

    items = read_warmup_file(Path(args.file)) if args.file else list(DEFAULT_WARMUP)
    t0 = time.perf_counter()
    key = args.api_key or load_client_settings().api_key
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="req", desc="warm-up", file=sys.stderr, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)
    try:
        report = asyncio.run(warmup_remote(args.url, items, api_key=key, batches_in_flight=args.batches_in_flight,
                                           on_progress=progress))
    finally:
        if bar is not None:
            bar.close()
    dump({"items": len(items), "seconds": round(time.perf_counter() - t0, 2), **report.as_dict()})
    return 1 if getattr(report, "failed", 0) else 0


# ---- parser ----------------------------------------------------------------------------------
def _search_flags(p: argparse.ArgumentParser) -> None:
    """``--quality``, and the search internals it presets (hidden: for experiments)."""
    p.add_argument("--quality", action="store_true",
                   help="offline quality mode: the reverse-trained weights and a constrained beam "
                        "search reranked by how well each line explains the 上联 (slower)")
    p.add_argument("--beam", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--channel", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rescore", type=Path, action="append", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rescore-weight", type=float, default=None, help=argparse.SUPPRESS)


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", type=Path, default=None, help="weights (default: the shipped ones)")
    add_device(p)
    p.add_argument("--batch-size", type=int, default=64, help="sequences decoded together (default 64)")


def _request_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--style", default="traditional",
                   help="traditional, business, family or literary (default traditional)")
    p.add_argument("--n", type=int, default=1, help="candidates to write, sampled when > 1 (default 1)")
    p.add_argument("--seed", type=int, default=None, help="sample with this seed (default: greedy)")
    p.add_argument("--json", action="store_true", help="one JSON object a couplet")


def _add_generate(sub: Any) -> None:
    g = sub.add_parser("generate", help="write the 下联 and 横批 for an upper line")
    g.add_argument("upper", nargs="?", help="the 上联 (or --file)")
    g.add_argument("--file", help="one upper line per line (or a TSV with an 'upper' column)")
    _request_flags(g)
    _search_flags(g)
    _model_flags(g)
    g.set_defaults(fn=cmd_generate)


def _add_compose(sub: Any) -> None:
    c = sub.add_parser("compose", help="a whole personalised couplet (藏头)")
    grp = c.add_mutually_exclusive_group(required=True)
    grp.add_argument("--heads", help="a name of 1-4 characters: a 2-character name heads the lines in order "
                     "(王伟: 王/伟); of a 3- or 4-character one the given name heads them (王秀英: 秀/英); "
                     "a repeated character heads both (丹丹)")
    grp.add_argument("--keyword", help="a theme word the upper line begins with")
    c.add_argument("--length", type=int, default=7, help="characters per line: 5 or 7 (default 7)")
    _request_flags(c)
    _search_flags(c)
    _model_flags(c)
    c.set_defaults(fn=cmd_compose)


def _add_eval(sub: Any) -> None:
    e = sub.add_parser("eval", help="score the model on a TSV of upper/lower pairs")
    e.add_argument("--data", required=True, help="a TSV of upper and lower lines (e.g. runs/data/val.tsv)")
    e.add_argument("--limit", type=int, default=None, help="score only the first N pairs")
    e.add_argument("--json", action="store_true", help="the report as one JSON object")
    e.add_argument("--baselines", action="store_true", help="also score a random real lower and gold")
    e.add_argument("--tone-bias", type=float, default=None, help=argparse.SUPPRESS)
    _search_flags(e)
    e.add_argument("--zodiac-year", type=int, default=None,
                   help="apply the zodiac rule of this year (default: none; the validation couplets "
                        "were written for many years)")
    _model_flags(e)
    e.set_defaults(fn=cmd_eval)


def _add_serve(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the HTTP service (embedded defaults: no Redis needed)",
                       description="Flags override the CHUNLIAN_* environment (docs: configuration).")
    s.add_argument("--host", help="address to listen on (default $CHUNLIAN_HOST or 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default $CHUNLIAN_PORT or 8000)")
    s.add_argument("--model-path", type=Path, help="weights (default: the shipped ones)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   help="where the model runs (default $CHUNLIAN_DEVICE or auto)")
    s.add_argument("--max-batch-size", type=int, help="rows decoded together (default 128)")
    s.add_argument("--max-wait-ms", type=float, help="how long a lone request waits for company (default 5)")
    s.add_argument("--max-queue-size", type=int, help="requests waiting before 429 (default 1024)")
    s.add_argument("--redis-url", help="result cache and job store (default: in-process)")
    s.add_argument("--batching", choices=["continuous", "static"], help=argparse.SUPPRESS)
    add_log_level(s, None)
    s.add_argument("--torch-threads", type=int, help="torch threads (default 0: the cores, at most 4)")
    s.add_argument("--engine-replicas", type=int,
                   help="engine processes, each with its share of the cores (0: one per core)")
    s.set_defaults(fn=cmd_serve)


def _add_warmup(sub: Any) -> None:
    w = sub.add_parser("warmup", help="warm a running service or cluster")
    w.add_argument("--url", required=True, help="the service or nginx in front of a cluster")
    w.add_argument("--file", help="entries, one a line: a 上联; a keyword of 1-4 characters (composed at "
                   "lengths 7 and 5); or name:王秀英, a name composed as the page does (7 characters, the best mode; "
                   "a 3-character name's given name heads the lines); default: the built-in list")
    w.add_argument("--api-key", default=None,
                   help="X-API-Key, needed when the service has CHUNLIAN_API_KEYS (default: $CHUNLIAN_API_KEY)")
    w.add_argument("--batches-in-flight", type=whole_number(1, 64, "batches"), default=2,
                   help="batches of 256 sent at once (behind nginx: to that many instances; default 2)")
    add_no_progress(w)
    w.set_defaults(fn=cmd_warmup)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="chunlian", description="Spring Festival couplets (春联)")
    sub = ap.add_subparsers(dest="command", required=True)
    for add in (_add_generate, _add_compose, training_cli.register_data, training_cli.register_distill,
                training_cli.register_train, _add_eval, _add_serve, _add_warmup,
                bench_cli.register, jobs_cli.register, cluster_cli.register):
        add(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except InvalidInput as e:
        return fail(e.message)
    except ConfigError as e:
        return fail(str(e))
    except ChunlianError as e:
        print(f"chunlian: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
