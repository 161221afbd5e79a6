"""gpufeed.doctor on real loaders with an injected slowdown names the right bottleneck.

Each scenario has one verdict on any machine, busy or quiet, with any number of cores:

* read: ``read`` sleeps 60 ms per image: workers are blocked (S), not running, and reading is
  most of their time -> "read", whatever else runs on the machine. Its fix (more workers for
  latency, or packing for a busy disk) also reads the machine's iowait, which other jobs' disk
  traffic raises: that choice is checked on the run's evidence, disk quiet and busy. With
  reads in flight and 300 ms per read, far longer than a worker needs to decode the one task
  it holds ahead at ``prefetch_factor=2``, the fix also names ``prefetch_factor`` (from the
  measured latency).
* decode: 1600x1200 JPEGs make decode ~90% of worker time. The test runs on two CPUs (affinity,
  inherited by the forked workers) with two workers: both CPUs are taken, by our workers or by
  other jobs: no core to spare -> "decode".
* workers: one decode-bound worker leaves a core idle only if no other job takes it, so the
  real run checks the evidence (CPU-bound, starving) and the verdict is checked on that
  evidence with and without a spare core; the real "workers" run is ``num_workers=0``.
* compute: a 150 ms step over a loader that needs ~10 ms a batch -> "compute"; the replay runs
  the step again, and what its time says is checked on the run's evidence (the replay's sleeps
  and the run's oversleep by what the load makes them).

Worker states come from thread sampling, not CPU percentages, so contention from other
processes (which lowers every CPU share) does not turn a CPU-bound worker into a "read".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from torch.utils.data import Dataset

from gpufeed import FastLoader, ImageDataset, ImageFolder, ResizeCenterCrop
from gpufeed.cli import main
from gpufeed.doctor import decide, diagnose

pytestmark = pytest.mark.timeout(60)  # each run takes 1-4 s

EVAL = ResizeCenterCrop(224, 256)


class SlowReadFolder(ImageFolder):
    """An image folder on "slow storage": each read waits 60 ms (no CPU, no disk). Long against
    what the machine's load adds to each read (measured under 4 CPU hogs on 2 cores: ~20 ms of
    waiting to run after each wake-up and a slower decode, counted as running), so that the
    workers stay mostly blocked."""

    def read(self, index: int) -> bytes:
        time.sleep(0.06)
        return super().read(index)


class SlowBytes(Dataset):
    """(JPEG bytes, label) of the images under ``root`` after ``latency_s`` (network storage)."""

    def __init__(self, root: Path, latency_s: float) -> None:
        self.items = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]
        self.latency_s = latency_s

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        time.sleep(self.latency_s)
        return self.items[i], i % 2


@pytest.fixture(scope="module")
def small_root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=24, size=(240, 320), seed=3)


@pytest.fixture(scope="module")
def big_root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=12, size=(1200, 1600), seed=4)


def run(dataset, num_workers: int, *, batches: int = 10, step_ms: float = 0.0, batch_size: int = 4):
    # fork: the workers inherit the CPUs this thread runs on (see on_cpus)
    context = {"multiprocessing_context": "fork", "persistent_workers": True} if num_workers else {}
    with FastLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                    **context) as loader:
        return diagnose(loader, batches=batches, step_ms=step_ms, warmup_batches=3,
                        replay_batches=4, sample_interval_s=0.02)


@contextlib.contextmanager
def on_cpus(n: int):
    """Run this thread (and the processes it forks) on the first ``n`` usable CPUs."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:n])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_slow_reads_are_read(small_root):
    # one read at a time, as set: the default (auto) would switch to read-ahead mid-run
    report = run(SlowReadFolder(small_root, transform=EVAL, read_concurrency=1), 2)
    ev = report.evidence
    assert report.bottleneck == "read", str(report)
    assert ev.shares["read"] > 0.5 and ev.worker_blocked > 0.5
    # The fix also reads the machine's iowait, which other jobs' disk traffic raises: it is
    # checked on this run's evidence with the disk quiet, then busy.
    _, reasons, latency_fix = decide(replace(ev, iowait_fraction=0.0, dstate_fraction=0.0))
    assert "latency" in reasons[-1] and "num_workers to 4" in latency_fix  # overlapped by more workers
    _, reasons, disk_fix = decide(replace(ev, iowait_fraction=0.3))
    assert "the disk is the limit" in reasons[-1] and "gpufeed pack" in disk_fix
    assert "num_workers to" not in disk_fix
    assert report.fix in (latency_fix, disk_fix), str(report)


def test_reads_longer_than_the_decode_of_the_held_tasks_name_prefetch_factor(small_root):
    # 300 ms: longer than a batch's decode even on a loaded machine (measured under 4 CPU hogs
    # on 2 cores: up to ~80 ms for 8 images), so that reads stay the limit
    ds = ImageDataset(SlowBytes(small_root, 0.3), EVAL, read_concurrency=16)
    assert len(ds) == 48
    report = run(ds, 2, batch_size=8)
    ev = report.evidence
    assert report.bottleneck == "read", str(report)
    # every sample read once, timed. The stats count a batch when it arrives, so the 10 batches
    # consumed in the window are 10 arrived ones give or take the 2 x 2 tasks in flight (9-11 seen)
    assert ev.prefetch_factor == 2 and ev.reads == ev.samples >= (10 - 2 * 2) * 8, str(ev)
    assert ev.read_latency_mean_s >= 0.3  # timed on the read threads: the injected 300 ms (sleep never less)
    assert any(r.startswith("a read takes ") and "prefetch_factor=2 a worker holds 1 task (8 reads)"
               in r for r in report.reasons), str(report)
    to = int(report.fix.split("raise prefetch_factor to ")[1].split()[0])
    # 1 + reads in flight needed (at most 256) / batch: a 300 ms read against 8 images' decode
    needed = min(math.ceil(ev.read_latency_mean_s / ev.decode_per_batch_s * 8), 256)
    assert to == 1 + math.ceil(needed / 8) > 2, str(report)
    assert "(now 2: reads run ahead only within the tasks a worker holds)" in report.fix


def test_decode_bound_workers_on_every_core_are_decode(big_root):
    with on_cpus(2):
        report = run(ImageFolder(big_root, transform=EVAL), 2)
    ev = report.evidence
    assert report.bottleneck == "decode", str(report)
    assert ev.shares["decode"] > 0.6 and ev.worker_running > 0.6 and ev.data_wait_fraction > 0.5
    assert ev.stored_short_side_px == 1200 and "--max-side 512" in report.fix


def test_one_decode_bound_worker_is_workers_with_an_idle_core_and_decode_without(big_root):
    report = run(ImageFolder(big_root, transform=EVAL), 1)
    ev = report.evidence
    assert ev.worker_running > 0.6 and ev.data_wait_fraction > 0.5, str(report)
    bottleneck, _, fix = decide(replace(ev, idle_cores=1.0, other_cores=0.0))
    assert bottleneck == "workers" and "raise num_workers to 2" in fix
    bottleneck, reasons, _ = decide(replace(ev, idle_cores=0.0, other_cores=1.0))
    assert bottleneck == "decode" and any("no core to spare" in r for r in reasons)


def test_loading_in_the_training_process_is_workers(small_root):
    report = run(ImageFolder(small_root, transform=EVAL), 0, batches=6)
    assert report.bottleneck == "workers", str(report)
    assert "load in worker processes: num_workers=" in report.fix


def test_slow_step_over_a_fast_loader_is_compute(small_root):
    report = run(ImageFolder(small_root, transform=EVAL), 2, batches=8, step_ms=150.0)
    ev = report.evidence
    assert report.bottleneck == "compute", str(report)
    assert ev.data_wait_fraction < 0.1
    assert ev.replay_batches == 4 and ev.replay_step_s >= 0.15  # the replay ran the 150 ms step (sleep never less)
    assert report.reasons[-1].startswith("replaying 4 kept batches without the loader"), str(report)
    # Whether the replay was faster than the run compares two series of sleeps, which oversleep
    # by what the machine's load makes them: checked on this run's evidence with the replay
    # as long as the run's batches, then 3x shorter.
    _, reasons, fix = decide(replace(ev, replay_step_s=ev.batch_s))
    assert "step itself limits" in reasons[-1] and fix.startswith("the loader keeps up: optimize")
    _, reasons, fix = decide(replace(ev, replay_step_s=ev.batch_s / 3))
    assert "the loader's workers slow the step" in reasons[-1] and "num_workers=1" in fix


def test_doctor_cli_prints_the_report_and_writes_json(small_root, tmp_path, capsys):
    out = tmp_path / "doctor.json"
    # one worker makes a batch of 4 in ~10 ms: a 150 ms step is what limits, busy machine or not
    code = main(["doctor", str(small_root), "--workers", "1", "--batch-size", "4", "--batches", "6",
                 "--step-ms", "150", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "gpufeed doctor: bottleneck = compute" in printed and f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert data["bottleneck"] == "compute"
    assert data["evidence"]["batches"] == 6 and data["config"]["num_workers"] == 1
    assert data["reasons"] and data["fix"]


def test_doctor_cli_rejects_a_negative_step(small_root, capsys):
    with pytest.raises(SystemExit):
        main(["doctor", str(small_root), "--step-ms", "-1"])
    assert "--step-ms" in capsys.readouterr().err
