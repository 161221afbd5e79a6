"""gpufeed.doctor on real loaders with an injected slowdown names the right bottleneck.

Built for a 2-core machine that other jobs share:

* read: ``read`` sleeps 20 ms per image: workers are blocked (S), not running, and reading is
  most of their time -> "read", whatever else runs on the machine.
* decode vs workers: 1600x1200 JPEGs make decode ~90% of worker time. With num_workers=2 both
  cores are taken (by our workers or by other jobs): no core to spare -> "decode". With
  num_workers=1 the second core is idle on a quiet machine -> "workers"; on a busy one the
  doctor rightly says "decode" (no idle core), so that test checks the verdict against the
  measured idle cores, and that the same worker evidence with a spare core gives "workers".
* compute: a 150 ms step over a fast loader -> "compute", confirmed by the replay.

Worker states come from thread sampling, not CPU percentages, so contention from other
processes (which lowers every CPU share) does not turn a CPU-bound worker into a "read".
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.cli import main
from gpufeed.doctor import SPARE_CORES, decide, diagnose
from gpufeed.synth import make_image_folder

EVAL = ResizeCenterCrop(224, 256)


class SlowReadFolder(ImageFolder):
    """An image folder on "slow storage": each read waits 20 ms (no CPU, no disk)."""

    def read(self, index: int) -> bytes:
        time.sleep(0.02)
        return super().read(index)


@pytest.fixture(scope="module")
def small_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("doctor-small")
    make_image_folder(root, num_classes=2, per_class=24, size=(240, 320), seed=3)
    return root


@pytest.fixture(scope="module")
def big_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("doctor-big")
    make_image_folder(root, num_classes=2, per_class=12, size=(1200, 1600), seed=4)
    return root


def run(dataset, num_workers: int, *, batches: int = 10, step_ms: float = 0.0, batch_size: int = 4):
    with FastLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                    persistent_workers=True) as loader:
        return diagnose(loader, batches=batches, step_ms=step_ms, warmup_batches=3,
                        replay_batches=4, sample_interval_s=0.02)


@pytest.mark.timeout(120)
def test_slow_reads_are_read(small_root):
    report = run(SlowReadFolder(small_root, transform=EVAL), 2, batch_size=8)
    ev = report.evidence
    assert report.bottleneck == "read", str(report)
    assert ev.shares["read"] > 0.5 and ev.worker_blocked > 0.5
    assert "num_workers to 4" in report.fix  # no iowait: latency, overlapped by more workers


@pytest.mark.timeout(120)
def test_decode_bound_workers_on_every_core_are_decode(big_root):
    report = run(ImageFolder(big_root, transform=EVAL), 2)
    ev = report.evidence
    assert report.bottleneck == "decode", str(report)
    assert ev.shares["decode"] > 0.6 and ev.worker_running > 0.6 and ev.data_wait_fraction > 0.5
    assert ev.stored_short_side_px == 1200 and "--max-side 512" in report.fix


@pytest.mark.timeout(120)
def test_one_decode_bound_worker_with_an_idle_core_is_workers(big_root):
    report = run(ImageFolder(big_root, transform=EVAL), 1)
    ev = report.evidence
    assert ev.worker_running > 0.6 and ev.data_wait_fraction > 0.5, str(report)
    if ev.idle_cores >= SPARE_CORES:
        assert report.bottleneck == "workers", str(report)
        assert "raise num_workers to 2" in report.fix
    else:  # another job took the spare core during the run: no core to give a new worker
        assert report.bottleneck == "decode", str(report)
        assert any("no core to spare" in r for r in report.reasons)
    quiet = replace(ev, idle_cores=ev.usable_cores - 1.0, other_cores=0.0)
    bottleneck, _, fix = decide(quiet)
    assert bottleneck == "workers" and "raise num_workers to 2" in fix


@pytest.mark.timeout(120)
def test_slow_step_over_a_fast_loader_is_compute(small_root):
    report = run(ImageFolder(small_root, transform=EVAL), 2, batches=8, step_ms=150.0)
    ev = report.evidence
    assert report.bottleneck == "compute", str(report)
    assert ev.data_wait_fraction < 0.1 and ev.replay_step_s == pytest.approx(0.15, abs=0.03)
    assert "step itself limits" in report.reasons[-1]


@pytest.mark.timeout(120)
def test_doctor_cli_prints_the_report_and_writes_json(small_root, tmp_path, capsys):
    out = tmp_path / "doctor.json"
    code = main(["doctor", str(small_root), "--workers", "1", "--batch-size", "8", "--batches", "6",
                 "--step-ms", "5", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "gpufeed doctor: bottleneck = " in printed and f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert data["bottleneck"] in {"read", "decode", "transform", "workers", "transfer", "compute"}
    assert data["evidence"]["batches"] == 6 and data["config"]["num_workers"] == 1
    assert data["reasons"] and data["fix"]


def test_doctor_cli_rejects_a_negative_step(small_root, capsys):
    with pytest.raises(SystemExit):
        main(["doctor", str(small_root), "--step-ms", "-1"])
    assert "--step-ms" in capsys.readouterr().err
