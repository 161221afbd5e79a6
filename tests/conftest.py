"""Suite-wide pytest hooks, and the fixture that runs the suite's fresh-interpreter runs side by side.

Most of a fresh interpreter's time in this suite is its single-threaded import of torch (and of
Lightning or Accelerate), and a torchrun or Lightning DDP process tree has mostly one busy core
at a time (a rank waits for the other's import, the launcher for its ranks). A test module lists
such runs in ``SIDE_BY_SIDE``: name -> (seconds it takes alone on 2 idle cores, a function of
``tmp_path_factory`` doing the run and returning what its tests check). The first test that asks
for the ``side_by_side`` fixture starts every run of the modules being tested, one per core,
longest first (tests/_concurrent.py), and waits for all of them, so that nothing runs beside the
other tests. Only for runs whose checks look at their own processes, directories, ports and
output, never at the machine's process table or /dev/shm as a whole.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest

from tests._concurrent import call_all
from tests._folders import ImageFolders


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

    These objects live until the test run ends anyway, but every full collection walked all of
    them: the benchmark harness's ``gc.collect()`` calls (before each memory reading) cost
    ~0.4 s each inside the suite, and the automatic ones add up too. Measured on tests/unit
    (2 busy cores): 32 s of 171 s in full collections; the four tests/unit/test_bench_*.py files:
    28 s -> 1.9 s in collections, 73 s -> 38 s wall. Objects the tests make are collected as
    before (fixtures do not exist yet at this point).
    """
    gc.collect()
    gc.freeze()


SideBySide = tuple[float, Callable[[pytest.TempPathFactory], Any]]


@pytest.fixture(scope="session")
def side_by_side(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every ``SIDE_BY_SIDE`` entry of the modules with a selected test: name -> result, or the
    exception the run raised (``tests._concurrent.result`` re-raises it in the tests that read it)."""
    runs: dict[str, SideBySide] = {}
    for module in {item.module for item in request.session.items if isinstance(item, pytest.Function)}:
        for name, run in getattr(module, "SIDE_BY_SIDE", {}).items():
            # one run may be shared by several modules (the same entry object, tests/_imports.py)
            assert runs.get(name, run) is run, f"two test modules name a side-by-side run {name!r}"
            runs[name] = run
    longest_first = sorted(runs, key=lambda name: -runs[name][0])
    tmp_path_factory.getbasetemp()  # made here, once: the runs' threads would race to make it
    return call_all({name: _bound(runs[name][1], tmp_path_factory) for name in longest_first})


def _bound(run: Callable[[pytest.TempPathFactory], Any], factory: pytest.TempPathFactory) -> Callable[[], Any]:
    return lambda: run(factory)



@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> ImageFolders:
    """Factory of synthetic image folders: ``image_folder(num_classes=2, per_class=6,
    size=((60, 90), (70, 100)), seed=3) -> root``, written once per spec per test run (see
    tests/_folders.py; ``private=True`` for a folder the caller may change)."""
    return ImageFolders(tmp_path_factory)
