"""FastLoader works where /dev/shm is Docker's default 64 MB, on the engine's generic path and on
the per-sample (detection) path, with batches over 100 MB; torch's DataLoader does not.

Needs a private mount namespace (root + unshare) to shrink /dev/shm without touching the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrent import result as run_result

ROOT = Path(__file__).resolve().parents[2]


def mount_namespace_available() -> tuple[bool, str]:
    """Whether this process can run a command with a private 64 MB /dev/shm; else why not."""
    if os.geteuid() != 0:
        return False, "needs root to mount a private /dev/shm (run the suite as root to include it)"
    if shutil.which("unshare") is None:
        return False, "needs the `unshare` command (util-linux)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, f"`unshare --mount` is not permitted here: {probe.stderr.strip()[:200]}"
    return True, ""


AVAILABLE, WHY_NOT = mount_namespace_available()


def _run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """tests/faults/_tiny_shm.py in a private mount namespace with its own 64 MB /dev/shm."""
    scratch = tmp_path_factory.mktemp("tiny-shm")
    script = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -m tests.faults._tiny_shm {scratch}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )


SIDE_BY_SIDE = {"tiny-shm": (5.5, _run)} if AVAILABLE else {}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
def test_batches_larger_than_a_64mb_dev_shm(side_by_side):
    proc = run_result(side_by_side, "tiny-shm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["shm_bytes"] == 64 * 1024 * 1024
    # 80 MB batches through a 64 MB /dev/shm: gpufeed's memfd arena is not bounded by it.
    assert result["fastloader"] == {"ok": True, "sums": [0 + 1, 2 + 3, 4 + 5]}
    # the host cache shared by processes is a memfd too: 96 MB of rows, read by a second process
    assert result["host_cache"] == {"sum": sum(range(96)), "bytes": 96 << 20}
    # the per-sample path: two float32 photos of 2200-2400 px a side (58-69 MB each) a batch
    detection = result["detection"]
    assert detection["ok"] is True, detection
    assert detection["indices"] == [[0, 1], [2, 3]] and min(detection["image_bytes"]) > 100 << 20
    # torch's workers put each batch in /dev/shm and die of SIGBUS or fail to allocate.
    assert result["dataloader"]["ok"] is False
    assert "shared memory" in result["dataloader"]["error"] or "Bus error" in result["dataloader"]["error"]
