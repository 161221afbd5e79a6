"""What every gpufeed subcommand shares: its one output function and argparse value types."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpufeed.errors import SKIP_HINT
from gpufeed.sources import ImageFolder, TarShards


def write(text: str) -> None:
    """The CLI's only output function: ``text`` and a newline on stdout, flushed."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def add_on_error(parser: argparse.ArgumentParser, what: str = "FastLoader") -> None:
    """``--on-error {raise,skip}``: the loader's ``on_error`` for a command that loads images."""
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                        help=f"a file that does not decode or cannot be read: raise (stop, naming the file and its "
                             f"sample index) or skip (leave it out and count it), as {what}'s "
                             f"on_error (default raise)")


def cli_text(text: str) -> str:
    """A library message as the command line says it: the keyword ``on_error='skip'`` becomes
    the flag ``--on-error skip``."""
    return text.replace(SKIP_HINT, "--on-error skip")


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1. Found: {n}.")
    return n


def non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0. Found: {n}.")
    return n


def is_tar_pattern(root: str) -> bool:
    """Whether a dataset argument names tar shards: a ``.tar`` path or URL, a glob
    (``shards/*.tar``) or a brace pattern (``train-{0000..0127}.tar``)."""
    return root.endswith(".tar")


def open_image_dataset(root: str, transform: Any) -> Any:
    """The dataset a subcommand's ``ROOT`` names: :class:`~gpufeed.TarShards` for tar shards
    (:func:`is_tar_pattern`), otherwise an :class:`~gpufeed.ImageFolder`."""

    if is_tar_pattern(root):
        return TarShards(root, transform=transform)
    return ImageFolder(root, transform=transform)
