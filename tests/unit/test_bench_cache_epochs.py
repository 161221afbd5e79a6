"""benchmarks/cache_epochs.py and cache_epochs_ab.py stay runnable: a tiny folder, two epochs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.synth import make_image_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench-cache")
    make_image_folder(root, num_classes=2, per_class=40, size=((40, 60), (40, 60)), seed=3)
    return root


def run(args: list[str]) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=150,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.timeout(180)
def test_cache_epochs_reports_the_uint8_line(tiny_root):
    out = run(["benchmarks/cache_epochs.py", str(tiny_root), "--epochs", "1", "--outputs", "uint8"])
    assert "batch released before the next" in out
    assert "of single-thread memcpy" in out and "parent_batches 2 of 4" in out  # 80 images: 2 batches


@pytest.mark.timeout(180)
def test_ab_interleaves_two_checkouts_holding_each_batch(tiny_root):
    """The A/B script with --hold (the loop that keeps each batch until the next arrives)."""
    out = run(["benchmarks/cache_epochs_ab.py", str(tiny_root), str(ROOT), str(ROOT), "--rounds", "2", "--hold"])
    lines = [line for line in out.splitlines() if "batch bytes / memcpy median" in line]
    assert len(lines) == 2 and all("2 epochs" in line and "CPU per batch" in line and "batch held" in line
                                   for line in lines)
