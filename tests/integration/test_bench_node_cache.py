"""benchmarks/node_cache.py stays runnable: two torchrun ranks on a tiny folder, two epochs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests._concurrent import result as run_result
from tests._folders import ImageFolders
from tests._scripts import ROOT, script_env


def _node_cache_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = ImageFolders(tmp_path_factory)(num_classes=2, per_class=16, size=((40, 60), (40, 60)), seed=5)
    # run as a file: it measures the checkout on PYTHONPATH (benchmarks/README.md)
    args = ["benchmarks/node_cache.py", str(root), "--ranks", "2", "--epochs", "2", "--repeats", "1",
            "--workers", "0", "--batch-size", "8", "--cache-bytes", "64MB"]
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=script_env())


SIDE_BY_SIDE = {"bench-node-cache": (25.0, _node_cache_run)}  # tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_node_cache_reports_both_scopes_in_one_run(side_by_side):
    proc = run_result(side_by_side, "bench-node-cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "-- 2 ranks (1 launches per mode" in out
    # the host cache holds the folder after epoch 1: every rank hits every row of epoch 2
    assert "host hit rates per epoch rank 0: 0.00/1.00 | rank 1: 0.00/1.00" in out
    assert re.search(r"rank hit rates per epoch rank 0: 0\.00/0\.\d\d \| rank 1: 0\.00/0\.\d\d", out)
    assert out.count("copies of the decoded rows") == 2 and "the host cache's memfd pages (PSS)" in out
    assert re.search(r"host/rank: epoch 1 \d+\.\d\dx \(per pair: \d+\.\d\d\), last epoch \d+\.\d\dx", out)
