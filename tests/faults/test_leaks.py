"""Nothing leaks on any exit path: no child processes, gpufeed threads, memfds or /dev/shm files.

Each scenario runs in a fresh interpreter with a hard timeout (a hang is a failure).
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

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(90)


def _python(code_or_args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *code_or_args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.parametrize(
    "scenario",
    ["epoch_end", "break", "exception_in_loop", "exception_in_worker", "del_iterator", "close",
     "keyboard_interrupt"],
)
def test_exit_path_leaves_nothing(scenario):
    proc = _python(["-m", "tests.faults._leak_scenarios", scenario])
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state == {"children": [], "threads": [], "memfds": [], "shm_new": []}


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def test_interpreter_exit_with_live_loader_stops_workers():
    code = textwrap.dedent("""
        import sys
        from gpufeed import FastLoader
        from tests.faults._datasets import Squares
        loader = FastLoader(Squares(64), batch_size=4, num_workers=2, persistent_workers=True)
        it = iter(loader); next(it)
        print(*it.worker_pids, flush=True)
        # exit with the loader, its iterator and its workers alive
    """)
    proc = _python(["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    assert _wait_gone(pids, 5.0) == []


def test_sigkill_of_main_process_workers_exit_by_themselves():
    code = textwrap.dedent("""
        import time
        from gpufeed import FastLoader
        from tests.faults._datasets import Slow
        loader = FastLoader(Slow(1000, 0.05), batch_size=2, num_workers=2)
        it = iter(loader); next(it)
        print(*it.worker_pids, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_gone(pids, 3.0) == []  # orphans notice the dead parent within ~0.25 s
    finally:
        if proc.poll() is None:
            proc.kill()
