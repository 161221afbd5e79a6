"""Nothing leaks on any exit path: no child processes, gpufeed threads, memfds or /dev/shm files.

Each scenario runs with a hard timeout (a hang is a failure) in a child forked from one fresh
interpreter that has only imported torch and gpufeed (tests/faults/_leak_scenarios.py); the exit
of an interpreter with a live loader, and a SIGKILLed parent, each have a fresh interpreter. These runs go
side by side (tests/conftest.py): each looks only at its own process tree, threads and memfds,
and at /dev/shm names that gpufeed or its own processes made (gpufeed makes none on Linux: its
arenas are memfds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests._concurrent import result

ROOT = Path(__file__).resolve().parents[2]


def _python(code_or_args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *code_or_args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


SCENARIOS = ["epoch_end", "break", "exception_in_loop", "exception_in_worker", "del_iterator", "close",
             "keyboard_interrupt"]

LIVE_LOADER_AT_EXIT = textwrap.dedent("""
    import sys
    from gpufeed import FastLoader
    from tests.faults._datasets import SquareGrids
    loader = FastLoader(SquareGrids(64), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader); next(it)
    print(*it.worker_pids, flush=True)
    # exit with the loader, its iterator and its workers alive
""")


def _scenarios(_: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """Every scenario of ``SCENARIOS``, one forked child each, in one fresh interpreter."""
    return _python(["-m", "tests.faults._leak_scenarios", *SCENARIOS], timeout_s=120)


def _live_loader_at_exit() -> tuple[subprocess.CompletedProcess, list[int]]:
    """The run, then its worker pids still alive 5 s after it exited (checked right away, not
    when its siblings are done)."""
    proc = _python(["-c", LIVE_LOADER_AT_EXIT])
    pids = [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []
    return proc, _wait_gone(pids, 5.0)


SIGKILLED_PARENT = textwrap.dedent("""
    import time
    from gpufeed import FastLoader
    from tests.faults._datasets import Slow
    loader = FastLoader(Slow(1000, 0.05), batch_size=2, num_workers=2)
    it = iter(loader); next(it)
    print(*it.worker_pids, flush=True)
    time.sleep(60)
""")


SIDE_BY_SIDE = {  # see tests/conftest.py; seconds alone on 2 idle cores, mostly importing torch
    "leaks-scenarios": (5.0, _scenarios),
    "leaks-live-loader-at-exit": (2.9, lambda _: _live_loader_at_exit()),
    "leaks-sigkilled-parent": (2.2, lambda _: _sigkill_of_main_process()),
}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_exit_path_leaves_nothing(side_by_side, scenario):
    proc = result(side_by_side, "leaks-scenarios")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = json.loads(proc.stdout.strip().splitlines()[-1])[scenario]
    assert ran["exit"] == 0, proc.stderr[-3000:]
    assert ran["state"] == {"children": [], "threads": [], "memfds": [], "shm_new": []}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_interpreter_exit_with_live_loader_stops_workers(side_by_side):
    proc, alive = result(side_by_side, "leaks-live-loader-at-exit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.split()) == 2
    assert alive == []


def _sigkill_of_main_process() -> tuple[list[int], list[int], list[int]]:
    """Workers started, then their parent SIGKILLed: (worker pids, those alive before the kill,
    those still alive 3 s after the parent died)."""
    proc = subprocess.Popen([sys.executable, "-c", SIGKILLED_PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        before = [p for p in pids if psutil.pid_exists(p)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return pids, before, _wait_gone(pids, 3.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_sigkill_of_main_process_workers_exit_by_themselves(side_by_side):
    pids, before, after = result(side_by_side, "leaks-sigkilled-parent")
    assert len(pids) == 2 and before == pids
    assert after == []  # orphans notice the dead parent within ~0.25 s
