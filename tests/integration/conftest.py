"""The multi-process runs of tests/integration (torchrun, Lightning, Accelerate) side by side.

Each of these runs is a process tree of fresh interpreters importing torch and Lightning or
Accelerate, mostly one busy core at a time (a rank waits for the other's import, the launcher
waits for its ranks). A test module lists its runs in ``HEAVY_RUNS``: name -> (seconds it takes
alone on 2 idle cores, a function of ``tmp_path_factory`` doing the run and returning what its
tests check). The first test that asks for any of them starts every run of the modules being
tested, two at a time (tests/_concurrent.py), longest first, and waits for all of them, so that
nothing runs beside the other tests. Every run works in its own directories, on its own ports and
process group; none looks at another's processes or at the machine's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests._concurrent import call_all

HeavyRun = tuple[float, Callable[[pytest.TempPathFactory], Any]]


@pytest.fixture(scope="session")
def heavy_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every ``HEAVY_RUNS`` entry of the modules with a selected test: name -> result, or the
    exception the run raised (``tests._concurrent.result`` re-raises it in the tests that read it)."""
    runs: dict[str, HeavyRun] = {}
    for module in {item.module for item in request.session.items if isinstance(item, pytest.Function)}:
        for name, run in getattr(module, "HEAVY_RUNS", {}).items():
            assert name not in runs, f"two test modules name a heavy run {name!r}"
            runs[name] = run
    longest_first = sorted(runs, key=lambda name: -runs[name][0])
    return call_all({name: _bound(runs[name][1], tmp_path_factory) for name in longest_first})


def _bound(run: Callable[[pytest.TempPathFactory], Any], factory: pytest.TempPathFactory) -> Callable[[], Any]:
    return lambda: run(factory)

