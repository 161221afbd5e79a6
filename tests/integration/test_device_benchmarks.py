"""The device figures `make gpu-check` takes stay runnable without a GPU: benchmarks/core_scaling.py
at a tiny size, benchmarks/serve.py's --device option (the GPU serving goal, docs/gpu-feed.md:
a clear one-line refusal without CUDA; its sweep bounds, --stop-after-fails and --budget-s, on CPU)."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._concurrent import result as run_result
from tests._scripts import script_env

ROOT = Path(__file__).resolve().parents[2]
SCALING = "benchmarks.core_scaling"  # run as python -m, from the repository on PYTHONPATH
SERVE = "benchmarks.serve"


def _scaling_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path = tmp_path_factory.mktemp("core-scaling")
    out = tmp_path / "core_scaling.json"
    proc = subprocess.run(
        [sys.executable, "-m", SCALING, "--workers", "1,2", "--images", "24", "--dir", str(tmp_path / "images"),
         "--batch-size", "4", "--size", "48", "--resize", "56", "--seconds", "0.25", "--rounds", "2",
         "--json", str(out)],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=110,
    )
    return out, proc


def _cuda_refusal_run(_tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", SERVE, "--device", "cuda"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=50)


def _sweep_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[subprocess.CompletedProcess[str], Any]]:
    """The sweep with --stop-after-fails, then a budget too short for any point: (process, JSON) each."""
    tmp_path = tmp_path_factory.mktemp("serve-sweep")
    out = tmp_path / "serve.json"
    common = [sys.executable, "-m", SERVE, "--device", "cpu", "--models", "smallcnn", "--modes", "batch-1", "batcher",
              "--duration", "0.3", "--calibrate-s", "0.3", "--drain-s", "0.3", "--clients", "0", "--no-overload",
              "--images", "8", "--json", str(out)]
    runs = []
    for extra, limit in (([ "--rates", *map(str, SWEEP_MULTS), "--stop-after-fails", "2"], 120),
                         # no point fits (each needs its arrivals, drain and 2 s): no calibration either
                         (["--rates", "0.5", "1", "--budget-s", "1", "--batch1-capacity", "100"], 60)):
        out.unlink(missing_ok=True)
        proc = subprocess.run([*common, *extra], cwd=tmp_path, env=script_env(), capture_output=True, text=True,
                              timeout=limit)
        runs.append((proc, json.loads(out.read_text()) if out.exists() else None))
    return runs


def _failing_mode_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path = tmp_path_factory.mktemp("serve-failing-mode")
    out = tmp_path / "serve.json"
    proc = subprocess.run(
        [sys.executable, "-m", SERVE, "--models", "smallcnn", "--modes", "batch-1", "images", "--rates", "0.5",
         "--duration", "0.3", "--calibrate-s", "0.3", "--clients", "0", "--no-overload", "--images", "8",
         "--mp-context", "no-such-method", "--json", str(out)],
        cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=80)
    return out, proc


def _threads_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """benchmarks/serve_threads.py (per-thread CPU of the batcher) builds its services from serve.py's."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_threads", "--trivial", "--rate", "300",
         "--duration", "0.3", "--reps", "1", "--modes", "batch-1", "batcher", "--max-latency-ms", "40"],
        cwd=tmp_path_factory.mktemp("serve-threads"), env=script_env(), capture_output=True, text=True, timeout=80)


SWEEP_MULTS = [0.5, 6, 12, 24]
SIDE_BY_SIDE = {  # see tests/conftest.py; seconds alone on 2 idle cores
    "core-scaling-tiny": (3.8, _scaling_run),
    "serve-sweep": (8.0, _sweep_runs),
    "serve-failing-mode": (3.0, _failing_mode_run),
    "serve-threads": (2.5, _threads_run),
    **({} if torch.cuda.is_available() else {"serve-cuda-refusal": (2.5, _cuda_refusal_run)}),
}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_core_scaling_tiny_run_writes_rates_efficiency_and_topology(side_by_side):
    out, proc = run_result(side_by_side, "core-scaling-tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "goal: efficiency >= 85%" in proc.stdout and "hyperthreads" in proc.stdout
    result = json.loads(out.read_text())
    topo = result["topology"]
    assert topo["hyperthreads"] in (True, False, None) and topo["logical_cpus"] >= 1
    if topo["hyperthreads"] is not None:
        assert topo["hyperthreads"] == (topo["threads_per_core"] > 1)
    counts = result["counts"]
    assert counts[0] == 1 and all(k <= topo["usable_cores"] for k in counts)
    assert result["goal"]["workers"] == max(1, topo["usable_cores"] - 1) in counts
    assert 1 <= len(result["rounds"]) <= 2
    for measured in result["rounds"]:
        assert sorted(m["workers"] for m in measured) == counts
        assert all(m["images_per_s"] > 0 and m["images"] > 0 for m in measured)
    rows = {row["workers"]: row for row in result["rows"]}
    base = rows[1]["images_per_s"]
    for k, row in rows.items():
        assert row["images_per_s"] > 0
        assert row["efficiency"] == pytest.approx(row["images_per_s"] / (k * base))
    goal = result["goal"]
    assert goal["efficiency"] == pytest.approx(rows[goal["workers"]]["efficiency"])
    assert goal["met"] is (None if goal["workers"] == 1 else goal["efficiency"] >= 0.85)


def test_core_scaling_counts_and_cpu_lists():
    bench = importlib.import_module(SCALING)
    assert bench.counts_to_run([1, 2, 4, 8, 16], 16) == ([1, 2, 4, 8, 15, 16], 15)
    assert bench.counts_to_run([1, 2, 4, 8, 16], 2) == ([1, 2], 1)
    assert bench.counts_to_run([2, 4], 4) == ([1, 2, 3, 4], 3)
    assert bench._cpu_list("0-3,8") == [0, 1, 2, 3, 8] and bench._cpu_list("5") == [5]


def test_core_scaling_topology_reads_sibling_lists(tmp_path):
    bench = importlib.import_module(SCALING)
    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus:  # pairs (0,1), (2,3), ...: two threads per core
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        first = cpu - cpu % 2
        (folder / "thread_siblings_list").write_text(f"{first}-{first + 1}\n")
    topo = bench.topology(str(tmp_path))
    assert topo["threads_per_core"] == 2
    assert topo["hyperthreads"] is True and topo["physical_cores"] == len({c - c % 2 for c in cpus})
    assert bench.topology(str(tmp_path / "missing"))["hyperthreads"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: --device cuda would run")
@pytest.mark.timeout(600)
def test_serve_device_cuda_without_cuda_fails_in_one_line(side_by_side):
    proc = run_result(side_by_side, "serve-cuda-refusal")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve.py: --device cuda: no CUDA here"), proc.stderr


@pytest.mark.timeout(600)
def test_serve_sweep_stops_failed_modes_and_keeps_its_budget(side_by_side):
    """On CPU, with the options --device cuda defaults to: a mode that missed a rate is not offered
    higher ones; a budget too short for any point skips them all, and says so."""
    (proc, written), (short_proc, short_written) = run_result(side_by_side, "serve-sweep")
    mults = SWEEP_MULTS
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = written
    assert result["device"] == "cpu" and result["skipped"] == [] and result["errors"] == {}
    rates = [m * result["capacity_estimate"] for m in mults]
    batch1 = [r for r in result["rows"] if r["mode"] == "batch-1"]
    offered = [r["offered_qps"] for r in batch1]
    # 6x batch-1's capacity and more: its queue grows for the whole point, p99 far above the 50 ms
    # SLO. It is offered rates until it missed two in a row, then no more.
    assert offered == pytest.approx(rates[:len(offered)]) and 2 <= len(offered) < len(rates)
    assert [r["sustained"] for r in batch1[-2:]] == [False, False]
    assert result["stopped"]["batch-1"] == pytest.approx(rates[len(offered)])
    assert "batch-1 stopped after 2 unsustained rates in a row" in proc.stdout
    headline = result["headline"]
    assert headline["goal"] == 1.2
    if headline["mode"] is not None:
        assert headline["ratio"] == result["sustained"][f"{headline['mode']}/batch-1"]
        assert headline["met"] is (headline["ratio"] >= 1.2)

    proc = short_proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = short_written
    assert result["rows"] == [] and len(result["skipped"]) == 4
    assert "budget: 4 point(s) skipped" in proc.stdout
    assert result["headline"]["mode"] is None and math.isnan(result["headline"]["ratio"])


@pytest.mark.timeout(600)
def test_serve_mode_that_fails_is_reported_and_the_others_go_on(side_by_side):
    """One device run must not lose every figure to one failing mode: an ImageBatcher that cannot
    start (an unknown start method) fails its mode, batch-1 still runs, the exit status is 1."""
    out, proc = run_result(side_by_side, "serve-failing-mode")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    assert [r["mode"] for r in result["rows"]] == ["batch-1"] and result["rows"][0]["answered"] > 0
    assert result["errors"]["images"].startswith("ValueError: `mp_context` must be one of")
    assert "smallcnn: images FAILED: ValueError" in proc.stdout


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_serve_threads_reports_cpu_per_request_of_each_mode(side_by_side):
    proc = run_result(side_by_side, "serve-threads")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "max_latency_ms=40.0" in proc.stdout.splitlines()[0]
    rows = [line for line in proc.stdout.splitlines() if "CPU ms/request" in line]
    assert [row.split()[0] for row in rows] == ["batch-1", "batcher"], proc.stdout
    assert all("answered " in row and "gpufeed-batcher" not in rows[0] for row in rows)
