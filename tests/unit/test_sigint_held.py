"""``sigint_held``: a Ctrl-C that reaches the process inside the block is raised when the block
ends, not inside it, even when another thread (one that does not block SIGINT) takes the signal;
``_quiet_connection_errors`` passes every error but a connection's on."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gpufeed._engine.signals import sigint_held
from gpufeed.compare._images import _quiet_connection_errors

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")


def _sigint_delivered_to(thread_ready: threading.Event, stop: threading.Event) -> None:
    thread_ready.set()
    stop.wait(30)


def test_a_sigint_inside_the_block_is_raised_at_its_end_with_another_thread_running():
    ready, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=_sigint_delivered_to, args=(ready, stop), daemon=True)
    other.start()  # it does not block SIGINT: the kernel may hand it the signal
    assert ready.wait(30)
    reached_end = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_held():
                handled = threading.Event()  # sigint_held's recorder, seen running: no delay guessed
                recorder = signal.getsignal(signal.SIGINT)
                signal.signal(signal.SIGINT, lambda signum, frame: (recorder(signum, frame), handled.set()))
                signal.pthread_kill(other.ident, signal.SIGINT)  # to the thread that does not block it
                # Python runs the handler in this thread, inside the block, at a bytecode boundary
                # (a wait here would not wake for a signal another thread took): poll, 30 s at most
                deadline = time.monotonic() + 30
                while not handled.is_set() and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert handled.is_set(), "the SIGINT was never handled"
                reached_end = True
    finally:
        stop.set()
        other.join(30)
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nothing_is_raised_without_a_sigint_and_a_custom_handler_is_called_after():
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with sigint_held():
            pass
        assert calls == []
        with sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            assert calls == []
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_connection_errors_are_not_reported_others_are():
    seen: list[type[BaseException]] = []
    hook = _quiet_connection_errors(lambda kind, value, tb: seen.append(kind))
    hook(ConnectionResetError, ConnectionResetError(104, "reset"), None)
    hook(BrokenPipeError, BrokenPipeError(32, "pipe"), None)
    hook(ValueError, ValueError("x"), None)
    assert seen == [ValueError]
