"""Ctrl-C and child processes: a terminal's SIGINT reaches the whole process group, workers
included. Workers leave it to the parent (which stops them); ``sigint_held`` closes the window
between a child's fork and its ``ignore_sigint``, where a Ctrl-C would interrupt it half set up
and print a traceback nobody asked for."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT blocked in the calling (main) thread for the block: children started inside inherit
    the block until they call ``ignore_sigint``; a Ctrl-C that arrives meanwhile reaches this
    process when the block ends. A no-op off the main thread or without ``pthread_sigmask``."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_sigint() -> None:
    """In a child process: ignore SIGINT (the parent handles Ctrl-C), then lift the block that
    ``sigint_held`` passed on (a SIGINT pending meanwhile is discarded)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
