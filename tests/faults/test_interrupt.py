"""Ctrl-C during ``gpufeed bench``: it exits promptly with one line, no traceback, no child left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gpufeed.synth import make_image_folder

# The property is "prompt" (it used to wait out a 30 s teardown timeout), not a speed figure:
# the bound is generous so that a busy CI machine does not fail it.
EXIT_BOUND_S = 10.0


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["2", "0"])
def test_ctrl_c_during_bench_exits_promptly_with_one_line(tmp_path, workers):
    root = tmp_path / "folder"
    make_image_folder(root, num_classes=2, per_class=16, size=(64, 80), seed=1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufeed", "bench", str(root), "--workers", workers, "--batch-size", "4",
         "--rounds", "1000", "--warmup", "0", "--epochs", "1", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        # Wait for the first round to be under way: worker processes (or, with 0 workers, a few
        # seconds of the in-process loop).
        started = time.monotonic()
        while time.monotonic() < started + 60 and proc.poll() is None:
            if workers == "0" and time.monotonic() > started + 5:
                break
            if workers != "0" and len(_descendants(proc.pid)) >= int(workers):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        seen = _descendants(proc.pid)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        out, err = proc.communicate(timeout=EXIT_BOUND_S + 20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert took < EXIT_BOUND_S, f"took {took:.1f}s to exit"
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["gpufeed bench: interrupted"], err
    gone, alive = psutil.wait_procs(seen, timeout=5)
    assert not alive, [p.cmdline() for p in alive]
