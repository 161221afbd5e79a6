"""Run exit-path scenarios, each then reporting what is left: child pids, gpufeed threads, memfd
descriptors and /dev/shm entries. Used by test_leaks.py.

    python -m tests.faults._leak_scenarios SCENARIO [SCENARIO ...]

Each scenario runs in its own child forked from this fresh interpreter, which has imported torch,
gpufeed and the test datasets and done nothing else (importing gpufeed starts nothing: see
tests/integration/test_fresh_imports.py), so every scenario starts from the state a fresh interpreter would
have, without importing torch again (~2.5 s of CPU each). A scenario that does not end within
``SCENARIO_TIMEOUT_S`` is killed and reported as such. Prints one JSON line: scenario ->
{"exit": the child's exit status (or "timeout"), "state": what it left, or null}.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
import traceback

import psutil

import gpufeed._engine.pool
from gpufeed import FastLoader
from tests._procs import gpufeed_memfds
from tests.faults._datasets import RaisesAt, SquareGrids

# Every process of this scenario, so /dev/shm entries made by other programs on the machine
# (torch names its files torch_<pid>_...) are not blamed on gpufeed.
_OURS = {os.getpid()}
_start_worker = gpufeed._engine.pool.WorkerPool._start


def _recording_start(self, worker_id: int) -> None:
    _start_worker(self, worker_id)
    _OURS.add(self.pid(worker_id))


gpufeed._engine.pool.WorkerPool._start = _recording_start


def _ours(name: str) -> bool:
    return "gpufeed" in name or any(f"_{pid}_" in name for pid in _OURS)


def _state() -> dict:
    me = psutil.Process()
    return {
        "children": [c.pid for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE],
        "threads": [t.name for t in threading.enumerate() if t.name.startswith("gpufeed")],
        "memfds": list(gpufeed_memfds().values()),
        "shm": sorted(os.listdir("/dev/shm")),
    }


def _loader(**kw) -> FastLoader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 2)
    return FastLoader(SquareGrids(64), **kw)


def run(scenario: str) -> dict:
    shm_before = sorted(os.listdir("/dev/shm"))
    if scenario == "epoch_end":
        loader = _loader()
        list(loader)
        del loader
    elif scenario == "break":
        loader = _loader()
        for k, batch in enumerate(loader):
            if k == 2:
                break
        del loader, batch  # the user drops the batch it held too
    elif scenario == "exception_in_loop":
        loader = _loader()
        try:
            for k, batch in enumerate(loader):
                if k == 2:
                    raise ValueError("user code failed")
        except ValueError:
            pass
        del loader, batch
    elif scenario == "exception_in_worker":
        loader = FastLoader(RaisesAt(64, at=9), batch_size=4, num_workers=2)
        try:
            list(loader)
        except KeyError:
            pass
        del loader
    elif scenario == "del_iterator":
        loader = _loader(persistent_workers=True)
        it = iter(loader)
        next(it)
        del it, loader
    elif scenario == "close":
        loader = _loader(persistent_workers=True)
        batch = next(iter(loader))
        indices, squares = batch[0].clone(), batch[1].clone()
        loader.close()
        # a held batch stays readable after close, with the values it had before
        assert batch[0].equal(indices) and batch[1].equal(squares)
        assert indices.tolist() == [0, 1, 2, 3] and squares[:, 0, 0].tolist() == [0.0, 1.0, 4.0, 9.0]
        del batch
    elif scenario == "keyboard_interrupt":
        loader = _loader()
        try:
            for k, batch in enumerate(loader):
                if k == 2:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaches the main thread
        except KeyboardInterrupt:
            pass
        del loader, batch
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    gc.collect()
    state = _state()
    state["shm_new"] = sorted(n for n in set(state.pop("shm")) - set(shm_before) if _ours(n))
    return state


SCENARIO_TIMEOUT_S = 60.0


def _forked(scenario: str) -> dict:
    """``run(scenario)`` in a child forked from this process: {"exit": status, "state": ...}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the parent's loop
        status = 1
        try:
            os.close(read_end)
            _OURS.clear()
            _OURS.add(os.getpid())
            with os.fdopen(write_end, "w") as report:
                report.write(json.dumps(run(scenario)))
            status = 0
        except BaseException:  # noqa: BLE001 - whatever it was, the parent reads it on stderr
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + SCENARIO_TIMEOUT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:  # a hang is a failure
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            return {"exit": "timeout", "state": None}
        time.sleep(0.02)
    with os.fdopen(read_end) as report:
        text = report.read()
    return {"exit": os.waitstatus_to_exitcode(done[1]), "state": json.loads(text) if text else None}


if __name__ == "__main__":
    print(json.dumps({scenario: _forked(scenario) for scenario in sys.argv[1:]}))
