"""What both command lines share: ``--version``, port arguments and errors that show the
subcommand's usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

__all__ = ["add_version", "parse_args", "port_number"]


def port_number(text: str) -> int:
    """An ``argparse`` type: a TCP port number, 0 for any free port."""
    port = int(text) if text.strip().isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return port


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints ``PROG VERSION`` (the installed kaos-otel distribution's version)."""
    try:
        version = metadata.version("kaos-otel")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")


def _leaf(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The innermost subcommand parser the words of ``argv`` select."""
    for word in argv:
        choices = [
            action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)
        ]
        if not choices or word.startswith("-"):
            continue
        child = choices[0].get(word)
        if child is None:
            break
        parser = child
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse like ``parser.parse_args``, but report unknown options with the subcommand's usage."""
    words = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(words)
    if unknown:
        _leaf(parser, words).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args
