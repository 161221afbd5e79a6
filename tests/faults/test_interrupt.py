"""Ctrl-C during ``gpufeed bench``: it exits promptly with one line, no traceback, no child left."""

from __future__ import annotations

import functools
import inspect
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from gpufeed.compare._compare import compare
from tests._concurrent import result as run_result
from tests._folders import ImageFolders

# The property is "prompt": it does not wait out the harness's teardown timeout for workers
# that an interrupted round left running (it used to). An exit that waits it out takes at least
# that long whatever the load; a prompt one takes about a second alone, so no load reaches it.
EXIT_BOUND_S = inspect.signature(compare).parameters["teardown_timeout_s"].default


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _decoder_loaded(pid: int) -> bool:
    """Whether the process has mapped a JPEG decoder's library (importing gpufeed maps none)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return any(name in line for line in maps for name in ("turbojpeg", "cv2"))
    except OSError:
        return False


def _interrupted_bench(workers: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Start ``gpufeed bench``, Ctrl-C it once a round is under way; what the test checks."""
    root = ImageFolders(tmp_path_factory)(num_classes=2, per_class=16, size=(64, 80), seed=1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufeed", "bench", str(root), "--workers", workers, "--batch-size", "4",
         "--rounds", "1000", "--warmup", "0", "--epochs", "1", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        # Wait for the first round to be under way: worker processes (or, with 0 workers, a
        # second of the in-process loop after its first decode loaded a decoder library).
        started = time.monotonic()
        decoding = None
        while time.monotonic() < started + 60 and proc.poll() is None:
            if workers == "0" and decoding is None and _decoder_loaded(proc.pid):
                decoding = time.monotonic()
            if workers == "0" and decoding is not None and time.monotonic() > decoding + 1:
                break
            if workers == "0" and not os.path.exists("/proc/self/maps") and time.monotonic() > started + 5:
                break  # no /proc to read: a few seconds of the loop
            if workers != "0" and len(_descendants(proc.pid)) >= int(workers):
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            return {"ended_early": proc.communicate()}
        seen = _descendants(proc.pid)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        out, err = proc.communicate(timeout=EXIT_BOUND_S + 20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _gone, alive = psutil.wait_procs(seen, timeout=5)
    return {"ended_early": None, "took": took, "returncode": proc.returncode, "err": err,
            "alive": [p.cmdline() for p in alive]}


SIDE_BY_SIDE = {  # see tests/conftest.py; seconds alone on 2 idle cores
    "interrupt-bench-0": (4.0, functools.partial(_interrupted_bench, "0")),
    "interrupt-bench-2": (4.9, functools.partial(_interrupted_bench, "2")),
}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.parametrize("workers", ["2", "0"])
def test_ctrl_c_during_bench_exits_promptly_with_one_line(side_by_side, workers):
    got = run_result(side_by_side, f"interrupt-bench-{workers}")
    assert got["ended_early"] is None, got["ended_early"]
    took, err = got["took"], got["err"]
    assert took < EXIT_BOUND_S, f"took {took:.1f}s to exit"
    assert got["returncode"] == 130, (got["returncode"], err)
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["gpufeed bench: interrupted"], err
    assert not got["alive"], got["alive"]
