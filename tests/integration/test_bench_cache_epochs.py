"""benchmarks/cache_epochs.py and cache_epochs_ab.py stay runnable: a tiny folder, two epochs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrent import result as run_result
from tests._folders import ImageFolders

ROOT = Path(__file__).resolve().parents[2]


def _tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ImageFolders(tmp_path_factory)(num_classes=2, per_class=40, size=((40, 60), (40, 60)), seed=3)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=150,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _epochs_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = _tiny_root(tmp_path_factory)
    return _bench("-m", "benchmarks.cache_epochs", str(root), "--epochs", "1", "--outputs", "uint8",
                  "--memcpy-mb", "16")


def _ab_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = _tiny_root(tmp_path_factory)
    return _bench("-m", "benchmarks.cache_epochs_ab", str(root), str(ROOT), str(ROOT), "--rounds", "2", "--hold",
                  "--memcpy-mb", "16")


SIDE_BY_SIDE = {"bench-cache-epochs": (4.7, _epochs_run), "bench-cache-epochs-ab": (9.1, _ab_run)}  # tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_cache_epochs_reports_the_uint8_line(side_by_side):
    proc = run_result(side_by_side, "bench-cache-epochs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "batch released before the next" in out
    assert "of single-thread memcpy" in out and "parent_batches 2 of 4" in out  # 80 images: 2 batches


@pytest.mark.timeout(600)
def test_ab_interleaves_two_checkouts_holding_each_batch(side_by_side):
    """The A/B script with --hold (the loop that keeps each batch until the next arrives)."""
    proc = run_result(side_by_side, "bench-cache-epochs-ab")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "batch bytes / memcpy median" in line]
    assert len(lines) == 2 and all("2 epochs" in line and "CPU per batch" in line and "batch held" in line
                                   for line in lines)
