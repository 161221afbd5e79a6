"""Suite-wide pytest hooks."""

from __future__ import annotations

import gc
import multiprocessing

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """The fork server (started by the first forkserver loader or ImageBatcher) imports torch
    once, so its workers start with torch imported instead of importing it each (~2 s of CPU
    per worker on a busy 2-core host). The workers still unpickle the dataset and import
    gpufeed and the test modules themselves; "spawn" tests still start fresh interpreters.
    Measured on the forkserver tests of test_parity_workers, test_image_batcher and
    test_serve_http, alternating, 2 busy cores: 86 s -> 43 s and 57 s -> 27 s wall.
    """
    multiprocessing.set_forkserver_preload(["torch"])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything collection made (test modules, torch, lightning: ~390k objects) to the
    collector's permanent generation, where full collections no longer walk it.

    These objects live until the session ends anyway, but every full collection walked all of
    them: the benchmark harness's ``gc.collect()`` calls (before each memory reading) cost
    ~0.4 s each inside the suite, and the automatic ones add up too. Measured on tests/unit
    (2 busy cores): 32 s of 171 s in full collections; the four tests/unit/test_bench_*.py files:
    28 s -> 1.9 s in collections, 73 s -> 38 s wall. Objects the tests make are collected as
    before (fixtures do not exist yet at this point).
    """
    gc.collect()
    gc.freeze()
