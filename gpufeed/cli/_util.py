"""What every gpufeed subcommand shares: its one output function and argparse value types."""

from __future__ import annotations

import argparse
import sys


def write(text: str) -> None:
    """The CLI's only output function: ``text`` and a newline on stdout, flushed."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


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
