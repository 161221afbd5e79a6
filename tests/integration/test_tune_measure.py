"""tune and measure on real loaders with worker processes, and `gpufeed tune`."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from gpufeed import ImageFolder
from gpufeed.tune import (
    measure,
    tune,
)
from tests.unit.test_tune import (
    GiB,
    SleepyJpegs,
    _child_pids,
    _new_children_after,
    tiny_folder,  # noqa: F401 (fixtures, used by name)  # noqa: F401 (fixtures)
)


class SlowerReadFolder(ImageFolder):
    """Storage with 100 ms latency per read (a sleep: no CPU). Long against what a loaded
    machine adds to each read and decode (tens of ms under 4 CPU hogs on 2 cores), so that two
    workers read nearly twice as fast as one however busy the cores are, and the search's step
    from one worker to two is decided by the storage, not by the load."""

    def read(self, index: int) -> bytes:
        time.sleep(0.1)
        return super().read(index)


@pytest.mark.timeout(120)
def test_measure_and_tune_a_real_image_folder(tiny_folder):
    from gpufeed import FastLoader, ResizeCenterCrop

    dataset = ImageFolder(tiny_folder, transform=ResizeCenterCrop(224, 256))
    before = _child_pids()
    steps = []
    row = measure(lambda n, p: FastLoader(dataset, batch_size=8, num_workers=n, pin_workers=p),
                  1, batches=6, warmup_batches=1, step=steps.append)
    assert len(steps) == 7 and tuple(steps[0][0].shape) == (8, 3, 224, 224)  # crosses an epoch
    assert row.samples_per_s > 0 and row.cpu_percent > 0
    assert row.peak_memory_bytes > row.memory_per_worker_bytes > 0
    assert 0 <= row.data_wait_fraction <= 1

    slow = SlowerReadFolder(tiny_folder, transform=ResizeCenterCrop(224, 256))
    result = tune(dataset=slow, batch_size=8, max_workers=2, batches=4, warmup_batches=1,
                  available_memory_bytes=64 * GiB, progress=False, read_concurrencies=())
    counts = [(r.num_workers, r.pin_workers) for r in result.rows]
    assert counts == [(1, False), (2, False), (2, True)]
    assert result.recommended_num_workers == 2, result.reasons  # ~+90% over one worker
    assert any("max_workers limit" in r for r in result.reasons)
    assert result.recommended_cache_bytes == 32 * 224 * 224 * 3  # tiny: the whole dataset fits
    assert all(r.samples_per_s > 0 and r.peak_memory_bytes > 0 for r in result.rows)
    left = _new_children_after(before)
    assert left == set(), [psutil.Process(p).cmdline() for p in left]  # every loader was closed


@pytest.mark.timeout(60)
def test_cli_writes_json(tiny_folder, tmp_path, capsys):
    from gpufeed.cli import main

    out = tmp_path / "tune.json"
    rc = main(["tune", str(tiny_folder), "--max-workers", "1", "--batch-size", "8",
               "--batches", "3", "--warmup", "1", "--json", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["recommended_num_workers"] == 1
    assert [r["num_workers"] for r in data["rows"]] == [1, 1]
    assert data["args"]["batch_size"] == 8 and data["environment"]["usable_cores"] >= 1
    text = capsys.readouterr().out
    assert "images/s" in text and "recommended: FastLoader(dataset, num_workers=1" in text


@pytest.mark.timeout(120)
def test_tune_measures_an_automatic_dataset_at_one_read_and_leaves_it_automatic(tmp_path):
    from gpufeed import ResizeCenterCrop
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path, num_classes=2, per_class=8, size=(40, 50))
    ds = ImageFolder(tmp_path, ResizeCenterCrop(16, 20))
    assert ds.read_auto
    seen = []

    class Watch(ImageFolder):  # records the setting the loader's dataset had when measured
        def __len__(self) -> int:
            seen.append((ds.read_auto, ds.read_concurrency))
            return super().__len__()

    ds.__class__ = Watch
    result = tune(dataset=ds, batch_size=4, max_workers=1, batches=2, warmup_batches=1,
                  available_memory_bytes=64 * GiB, progress=False)
    assert result.rows[0].read_concurrency == 1
    assert (False, 1) in seen  # measured at an explicit single read, not switching mid-run
    assert ds.read_auto and ds.read_concurrency == 1  # the dataset's own setting is back


@pytest.mark.timeout(120)
def test_tune_measures_read_concurrency_when_reads_dominate():
    from gpufeed import ImageDataset, ResizeCenterCrop
    from gpufeed.cli.tune import format_recommendation

    ds = ImageDataset(SleepyJpegs(), ResizeCenterCrop(24, 32))
    assert ds.read_concurrency == 1
    result = tune(dataset=ds, batch_size=8, max_workers=1, batches=4, warmup_batches=1,
                  available_memory_bytes=64 * GiB, progress=False)
    reads = [r.read_concurrency for r in result.rows if r.num_workers == 1 and not r.pin_workers]
    assert reads[:2] == [1, 4], result.reasons  # 1 worker at 1 read, then more reads in flight
    assert result.rows[0].read_fraction is not None and result.rows[0].read_fraction >= 0.4
    assert result.recommended_read_concurrency > 1, result.format_table()
    assert any("measuring read_concurrency 4, 16, 64" in r for r in result.reasons)
    assert any("must be thread-safe" in r for r in result.reasons)
    assert ds.read_concurrency == 1  # the dataset's own setting is back
    assert result.recommended_row.read_concurrency == result.recommended_read_concurrency
    text = format_recommendation(result)
    assert f"read_concurrency={result.recommended_read_concurrency}" in text
