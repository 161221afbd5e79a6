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
    """Ctrl-C held off for the block: SIGINT is blocked in the calling (main) thread, so children
    started inside inherit the block until they call ``ignore_sigint``, and a SIGINT that reaches
    this process meanwhile is recorded and raised (``KeyboardInterrupt``, or the handler that was
    installed) when the block ends. Recording matters as much as blocking: the kernel gives a
    process-wide SIGINT to any thread that does not block it (a sampler or pin-memory thread),
    and Python then runs the handler in the main thread, inside the block. A no-op off the main
    thread or without ``pthread_sigmask``."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    received: list[int] = []
    handler = signal.getsignal(signal.SIGINT)
    record = handler is not None  # None: a handler set outside Python, which cannot be put back
    if record:
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a SIGINT pending for this thread lands here
        if record:
            signal.signal(signal.SIGINT, handler)
    if received:
        if callable(handler):
            handler(signal.SIGINT, None)
        elif handler == signal.SIG_DFL:
            raise KeyboardInterrupt


def ignore_sigint() -> None:
    """In a child process: ignore SIGINT (the parent handles Ctrl-C), then lift the block that
    ``sigint_held`` passed on (a SIGINT pending meanwhile is discarded)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
