"""One CLI dialect: help on every visible flag, units in names, ``--device auto`` by default,
and the renamed flags still accepted (hidden) for one release."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from chunlian.cli import build_parser


def _commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in p._actions:  # noqa: SLF001 - walking the tree is what a reference check does
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from _commands(child, (*path, name))


def _visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions  # noqa: SLF001
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]  # noqa: SLF001


COMMANDS = dict(_commands(build_parser()))


def test_every_command_is_registered() -> None:
    for name in ("generate", "compose", "data", "distill", "train", "eval", "serve", "warmup", "worker",
                 "cluster", "jobs", "bench"):
        assert (name,) in COMMANDS
    for name in ("engine", "service", "http", "sweep", "compare"):
        assert ("bench", name) in COMMANDS


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_visible_flag_has_help(path: tuple[str, ...]) -> None:
    missing = [a.option_strings or [a.dest] for a in _visible(COMMANDS[path]) if not a.help]
    assert missing == [], f"chunlian {' '.join(path)}: no help for {missing}"


OLD_NAMES = ("--loglevel", "--broker", "--quiet", "--threads", "--replicas", "--timeout", "--duration",
             "--warmup", "--ready-timeout", "--ensemble", "--engine-process")


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_no_old_dialect_in_help(path: tuple[str, ...]) -> None:
    shown = {o for a in _visible(COMMANDS[path]) for o in a.option_strings}
    assert not shown & set(OLD_NAMES)


def test_device_defaults_to_auto_everywhere() -> None:
    for path, p in COMMANDS.items():
        for a in p._actions:  # noqa: SLF001
            if "--device" in a.option_strings and a.default is not None:
                assert a.default == "auto", path


@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["worker", "--loglevel", "warning"], "log_level", "WARNING"),
    (["worker", "--broker", "redis://x"], "broker_url", "redis://x"),
    (["jobs", "submit", "f.txt", "--quiet"], "no_progress", True),
    (["jobs", "status", "j", "--timeout", "5"], "timeout_s", 5.0),
    (["train", "--quiet", "--out", "o"], "no_progress", True),
    (["train", "--out", "o"], "out_dir", "o"),
    (["data", "--data-dir", "d", "--out", "o"], "out_dir", "o"),
    (["bench", "engine", "--threads", "3"], "torch_threads", 3),
    (["bench", "engine", "--replicas", "1"], "engine_replicas", 1),
    (["bench", "http", "--duration", "2"], "duration", 2.0),
    (["bench", "http", "--duration-s", "2"], "duration", 2.0),
    (["cluster", "--ready-timeout", "9"], "ready_timeout_s", 9.0),
])
def test_old_names_are_hidden_aliases(argv: list[str], dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value
