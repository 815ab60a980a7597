"""Argument types and flags shared by every ``chunlian`` command (argparse only).

One dialect: units in names (``--timeout-s``), ``--log-level``, ``--broker-url``,
``--torch-threads``, ``--engine-replicas``, ``--no-progress``, ``--device auto`` by default,
help on every flag. A renamed flag keeps its old name as a hidden alias for one release
(``hidden_alias``; CHANGELOG.md lists them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2
DEVICES = ("auto", "cpu", "cuda")
LOG_LEVEL_CHOICES = ("DEBUG", "INFO", "WARNING", "ERROR")


class Parser(argparse.ArgumentParser):
    """Bad usage: one line on stderr naming the problem, exit status 2, nothing on stdout."""

    def error(self, message: str) -> Any:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def fail(msg: str, code: int = EXIT_USAGE, prog: str = "chunlian") -> int:
    """Print ``prog: error: msg`` on stderr and return ``code`` (the exit status)."""
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return code


def dump(obj: Any) -> None:
    """One JSON line on stdout (Chinese as written)."""
    print(json.dumps(obj, ensure_ascii=False))


def whole_number(lo: int, hi: int, unit: str, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of ``unit`` from ``lo`` to ``hi`` (``why`` says
    where the bound comes from), else a message naming what came."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of {unit}, got {text!r}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}{why}, got {n}")
        return n
    return parse


def positive(kind: type) -> Any:
    """An argparse type: ``kind`` of the text, which must be > 0."""
    def conv(text: str) -> Any:
        v = kind(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return v

    return conv


def hidden_alias(p: argparse.ArgumentParser, old: str, dest: str, **kwargs: Any) -> None:
    """``old`` still sets ``dest`` for one release, without showing in ``--help``."""
    p.add_argument(old, dest=dest, help=argparse.SUPPRESS, **kwargs)


def add_device(p: argparse.ArgumentParser, what: str = "the model") -> None:
    """``--device``, ``auto`` by default: cuda when torch sees a GPU, else cpu."""
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help=f"where {what} runs (default auto: cuda when a GPU is visible, else cpu)")


def add_no_progress(p: argparse.ArgumentParser, old_quiet: bool = False) -> None:
    """``--no-progress`` (and, where a command had it, the old ``--quiet``)."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    if old_quiet:
        hidden_alias(p, "--quiet", "no_progress", action="store_true")


def add_log_level(p: argparse.ArgumentParser, default: str | None, old: str | None = None) -> None:
    """``--log-level`` (any case), with ``old`` as a hidden alias."""
    shown = f"default {default}" if default else "default $CHUNLIAN_LOG_LEVEL or INFO"
    p.add_argument("--log-level", default=default, type=str.upper, choices=LOG_LEVEL_CHOICES,
                   help=f"log level ({shown})")
    if old:
        hidden_alias(p, old, "log_level", type=str.upper, choices=LOG_LEVEL_CHOICES)
