"""benchmarks/parent_cpu.py stays runnable: a tiny configuration (60 demo images of ~400x350,
64x64 crops, batch 8, one round) prints its table and goal line and writes every field."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrent import result as run_result

ROOT = Path(__file__).resolve().parents[2]
BENCH = "benchmarks.parent_cpu"  # run as python -m, from the repository on PYTHONPATH
FIELDS = {"name", "kind", "dtype", "cache", "persistent", "batches", "rounds", "parent_cpu_ms_per_batch",
          "parent_cpu_with_startup_ms_per_batch", "worker_cpu_ms_per_batch",
          "uncached_worker_cpu_ms_per_batch", "parent_over_worker", "max_workers", "batch_bytes",
          "parent_mb_per_s", "goal_met", "trim_cpu_ms_per_batch", "slots_emptied_per_batch",
          "worker_faults_per_batch", "images_per_s", "resident_batches_mean", "resident_batches_peak",
          "parent_cpu_without_trims_ms_per_batch", "parent_over_worker_without_trims",
          "max_workers_without_trims", "goal_met_without_trims"}


def _run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path = tmp_path_factory.mktemp("parent-cpu")
    out = tmp_path / "parent_cpu.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", BENCH, "--dir", str(tmp_path / "images"), "--images", "64",
         "--batch-size", "8", "--size", "64", "--resize", "72", "--rounds", "1", "--generic-samples", "64",
         "--only", "eval uint8,generic", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=140,
    )
    return out, proc


SIDE_BY_SIDE = {"bench-parent-cpu": (5.1, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_tiny_run_prints_the_table_and_writes_every_field(side_by_side):
    out, proc = run_result(side_by_side, "bench-parent-cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "shared machine" in proc.stdout and "CPU seconds, not wall time" in proc.stdout
    assert "parent/worker" in proc.stdout
    assert "goal (image path, no cache: parent CPU < 3% of a worker's per batch), all parent CPU:" in proc.stdout
    assert "goal (image path, no cache: parent CPU < 3% of a worker's per batch), without trims:" in proc.stdout

    result = json.loads(out.read_text())
    assert result["benchmark"] == "parent_cpu" and result["goal_ratio"] == 0.03
    assert result["shared_machine"] is True and result["batch_size"] == 8 and result["num_workers"] == 2
    assert result["memcpy_mb_per_s"] > 0 and "of this process's memcpy" in proc.stdout
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"eval uint8 no-cache", "eval uint8 no-cache non-persistent", "eval uint8 cache-hit",
                         "eval uint8 cache-hit non-persistent", "generic uint8 no-cache",
                         "generic-dataloader uint8 no-cache"}
    for name, row in rows.items():
        assert FIELDS <= set(row), name
        samples = 64 if name.startswith("generic") else 60  # the demo: 10 classes x 6 images
        assert row["batches"] == samples / 8 and row["rounds"] == 1, name
        assert row["parent_cpu_ms_per_batch"] > 0, name  # the parent did some work for every batch
        assert row["parent_cpu_with_startup_ms_per_batch"] > 0, name
        assert row["worker_cpu_ms_per_batch"] >= 0, name
        assert 0 <= row["trim_cpu_ms_per_batch"] <= row["parent_cpu_ms_per_batch"], name
        assert row["slots_emptied_per_batch"] >= 0 and row["images_per_s"] > 0, name
        assert math.isclose(row["parent_cpu_without_trims_ms_per_batch"] + row["trim_cpu_ms_per_batch"],
                            row["parent_cpu_ms_per_batch"], rel_tol=1e-6, abs_tol=1e-9), name
    uncached = rows["eval uint8 no-cache"]
    assert uncached["worker_cpu_ms_per_batch"] > 0  # the workers decoded: their CPU was read
    assert uncached["worker_faults_per_batch"] > 0  # and their page faults (a worker maps its slots)
    # the arena holds the batch the consumer has, at least (sampled while it holds it)
    assert 1 <= uncached["resident_batches_mean"] <= uncached["resident_batches_peak"]
    assert rows["generic-dataloader uint8 no-cache"]["resident_batches_peak"] == 0  # torch's: no arena
    assert uncached["goal_met"] in (True, False) and rows["eval uint8 cache-hit"]["goal_met"] is None
    ratio = uncached["parent_over_worker"]
    assert math.isclose(uncached["max_workers"], 1 / ratio)
    assert math.isclose(ratio * uncached["uncached_worker_cpu_ms_per_batch"],
                        uncached["parent_cpu_ms_per_batch"], rel_tol=1e-6)  # one round: no median mixing
    # The cached rows are compared with the uncached workers of the same pipeline.
    assert rows["eval uint8 cache-hit"]["uncached_worker_cpu_ms_per_batch"] == uncached["worker_cpu_ms_per_batch"]
    assert rows["eval uint8 cache-hit"]["batch_bytes"] == 8 * 64 * 64 * 3
    assert len(result["readings"]["eval uint8 cache-hit"]) == 1
