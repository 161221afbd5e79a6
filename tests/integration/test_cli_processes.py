"""The command line and its messages with processes: `python -m gpufeed --version` in a fresh
interpreter, more workers than cores, scripts/bench_summary.py."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import gpufeed
from gpufeed import FastLoader
from tests._concurrent import python, result

SIDE_BY_SIDE = {"cli-version": (2.4, python("-m", "gpufeed", "--version"))}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_version_flag_prints_the_version(side_by_side):
    out = result(side_by_side, "cli-version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"gpufeed {gpufeed.__version__}"


@pytest.mark.timeout(60)
def test_too_many_workers_is_said_once():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ds = torch.utils.data.TensorDataset(torch.arange(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FastLoader(ds, batch_size=2, num_workers=cores + 1) as loader:
            assert len(list(loader)) == 4
    said = [w for w in caught if "worker processes in total" in str(w.message)]
    assert len(said) == 1, [str(w.message)[:80] for w in said]


def test_bench_summary_reads_pytest_benchmark_json(tmp_path):
    data = {"benchmarks": [{"group": "g", "name": "test_a", "stats": {"ops": 100.0}},
                           {"group": "g", "name": "test_b", "stats": {"ops": 250.0}}]}
    path = tmp_path / "b.json"
    path.write_text(__import__("json").dumps(data))
    out = subprocess.run([sys.executable, "scripts/bench_summary.py", str(path)], capture_output=True,
                         text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 4
    assert lines[2].split() == ["g", "b", "250", "2.50"]
