"""OpenCV's thread pool at one thread around a fork (or a whole benchmark run), and libturbojpeg
loaded before a fast path's workers are forked.

``cv2.setNumThreads`` hangs in a forked child once the parent's pool has run (it waits for pool
threads that do not exist after fork), so a child cannot reconfigure itself: it has to inherit a
single-threaded pool. Workers are one-core each anyway; the parent's setting is restored after.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def single_threaded_cv2(import_if_missing: bool = False) -> Iterator[None]:
    """cv2 at one thread inside the block, restored after. Without cv2 imported (and
    ``import_if_missing`` false) it does nothing: a child that imports cv2 fresh is safe."""
    cv2 = sys.modules.get("cv2")
    if cv2 is None and import_if_missing:
        try:
            import cv2  # noqa: F811
        except ImportError:
            cv2 = None
    if cv2 is None or not hasattr(cv2, "setNumThreads"):
        yield
        return
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)


@contextlib.contextmanager
def fast_path_fork_guard() -> Iterator[None]:
    """``single_threaded_cv2``, with libturbojpeg loaded in this process first, so that forked
    workers inherit it: each worker would otherwise load it at its first decode (20 ms and an
    ``ldconfig`` run inside ctypes' library search, measured), in every epoch without
    ``persistent_workers``. It only loads: whether to warn of OpenCV decoding is the decode's
    business (a transform may have asked for OpenCV)."""
    from gpufeed.decoders._backends import turbo_state

    turbo_state()
    with single_threaded_cv2():
        yield
