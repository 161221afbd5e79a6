"""The GPU proof's tooling stays runnable without a GPU: benchmarks/cuda_feed.py's CPU dry run
(every code path, tiny sizes, stand-ins labelled), its overlap arithmetic, its budget and
--require-goals, and `make gpu-check`'s script, which says in one line that it checked nothing
and exits 2 without CUDA."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._concurrent import result as run_result
from tests._scripts import script_env

ROOT = Path(__file__).resolve().parents[2]
BENCH = "benchmarks.cuda_feed"  # run as python -m, from the repository on PYTHONPATH
pytestmark = pytest.mark.timeout(90)


def _bench_module():
    return importlib.import_module(BENCH)


def _dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path = tmp_path_factory.mktemp("cuda-feed-dry-run")
    out = tmp_path / "cuda_feed.json"
    proc = subprocess.run(
        [sys.executable, "-m", BENCH, "--cpu-dry-run", "--data-dir", str(tmp_path / "images"), "--json", str(out),
         "--variants", "wait+record_stream,nowait+keep"],
        cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=80,
    )
    return out, proc


def _gpu_check(_tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    env = script_env()
    env["GPU_PYTHON"] = sys.executable
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


GPU_CHECK_RUNS = not torch.cuda.is_available() and shutil.which("bash") is not None  # its test's skipifs
SIDE_BY_SIDE = {"cuda-feed-dry-run": (5.1, _dry_run),  # see tests/conftest.py
                **({"gpu-check-without-cuda": (2.5, _gpu_check)} if GPU_CHECK_RUNS else {})}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_cpu_dry_run_runs_every_feed_and_labels_its_stand_ins(side_by_side):
    out, proc = run_result(side_by_side, "cuda-feed-dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU DRY RUN" in proc.stdout and "goals: not judged on a CPU dry run" in proc.stdout
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["ok"] is True and result["errors"] == {}
    assert result["goals"] == []  # no goal is judged on CPU figures
    assert "CPU stand-in" in result["timing_source"]
    train, feed = result["train"], result["feed"]
    assert set(train["feeds"]) == set(feed["feeds"]) == {"a", "a[nowait+keep]", "b", "c"}
    # feed (a)'s guard variants side by side, each with its overlap figure (stand-ins on CPU)
    variants = result["variants"]
    assert list(variants) == ["wait+record_stream", "nowait+keep"]
    assert variants["nowait+keep"]["feed"] == "a[nowait+keep]" and variants["nowait+keep"]["keep_references"]
    for v in variants.values():
        assert 0 <= v["train_overlap_share"] <= 1 and "feed_overlap_share" in v  # no copy in CPU feed mode
    assert "feed (a)'s variants" in proc.stdout
    assert "no effect without a device" in train["feeds"]["a[nowait+keep]"]["label"]
    assert train["batch_mismatch"] == []  # the three feeds delivered the same first images
    for name, summary in train["feeds"].items():
        assert summary["images_per_s"] > 0 and 0 <= summary["data_wait_fraction"] <= 1, name
        assert "stand-in" in summary["label"]
        assert "CPU stand-in" in summary["overlap"]["source"]
        assert summary["overlap"]["copies"] > 0  # the trace was parsed, not skipped
    for name, res in feed["feeds"].items():
        assert res["batches_per_s"] > 0, name
        assert res["per_copy_gbps_events"] is None  # no H2D copy on CPU: never a made-up figure
    assert "CPU stand-in" in feed["pinned"]["source"]


def test_overlap_report_counts_copy_time_under_kernels():
    bench = _bench_module()
    kernels = [(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": s, "dur": e - s} for i, (s, e) in enumerate(kernels)]
    events += [
        # 4 us under kernels out of 4; 2 of 6; a device-to-host copy and a small copy's bandwidth ignored
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 8.0, "dur": 4.0,
         "args": {"bytes": 4_000_000}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 16.0, "dur": 6.0,
         "args": {"bytes": 1000}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 0.0, "dur": 50.0,
         "args": {"bytes": 4_000_000}},
    ]
    report = bench.overlap_report(events)
    assert report["copies"] == 2 and report["pinned_copies"] == 1 and report["pageable_copies"] == 1
    assert report["copy_ms"] == pytest.approx(0.010)
    assert report["overlap_share"] == pytest.approx(0.6)
    assert report["large_copies"] == 1
    assert report["per_copy_gbps_median"] == pytest.approx(1000.0)  # 4 MB in 4 us
    assert bench.overlap_report([])["overlap_share"] is None


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: make gpu-check would run every GPU check")
@pytest.mark.skipif(shutil.which("bash") is None, reason="scripts/gpu_check.sh needs bash")
def test_gpu_check_without_cuda_says_it_checked_nothing_and_exits_2(side_by_side):
    proc = run_result(side_by_side, "gpu-check-without-cuda")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device: nothing checked"), proc.stdout


def test_cuda_feed_out_of_budget_still_writes_its_json_and_require_goals_fails_without_goals(tmp_path):
    """A budget spent before the feed mode skips it and says so in the JSON; --require-goals
    passes only when every goal was judged and met, so a run with none judged exits 1."""
    out = tmp_path / "cuda_feed.json"
    proc = subprocess.run(
        [sys.executable, "-m", BENCH, "--cpu-dry-run", "--mode", "feed", "--budget-s", "0", "--require-goals",
         "--json", str(out)],
        cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=80,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["feed"] is None and "--budget-s 0 spent" in result["cut_short"]
    assert "--require-goals: no goal judged" in proc.stdout
