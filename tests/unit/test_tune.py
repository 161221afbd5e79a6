"""gpufeed.tune: the knee search on synthetic cost models, its rules, and one real run each for
the library and the ``gpufeed tune`` command."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace

import psutil
import pytest
from torch.utils.data import Dataset

from gpufeed import ImageFolder
from gpufeed._observe.rules import reads_ahead
from gpufeed.tune import (
    TuneRow,
    cache_bytes_needed,
    recommend_cache_bytes,
    recommend_prefetch_factor,
    search_read_concurrency,
    tune,
    usable_cores,
    worker_counts,
)
from gpufeed.tune._reads import prefetch_for_reads

GiB = 2**30
MiB = 2**20


class CostModel:
    """``measure_fn`` from a throughput curve; records what was measured."""

    def __init__(self, throughput, *, per_worker_bytes=50 * MiB, base_bytes=400 * MiB,
                 pin_speedup=1.0, wait=0.97):
        self.throughput = throughput
        self.per_worker_bytes = per_worker_bytes
        self.base_bytes = base_bytes
        self.pin_speedup = pin_speedup
        self.wait = wait
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, num_workers: int, pin_workers: bool) -> TuneRow:
        self.calls.append((num_workers, pin_workers))
        sps = self.throughput(num_workers) * (self.pin_speedup if pin_workers else 1.0)
        return TuneRow(
            num_workers=num_workers, pin_workers=pin_workers, samples_per_s=float(sps),
            cpu_percent=100.0 * min(num_workers, 5),
            peak_memory_bytes=self.base_bytes + num_workers * self.per_worker_bytes,
            memory_per_worker_bytes=self.per_worker_bytes, data_wait_fraction=self.wait)


def _tune(model, **kw):
    kw.setdefault("available_memory_bytes", 64 * GiB)
    return tune(measure_fn=model, progress=False, **kw)


def _unpinned(model):
    return [n for n, pin in model.calls if not pin]


def test_worker_counts_double_then_end_at_the_limit():
    assert worker_counts(1) == [1]
    assert worker_counts(2) == [1, 2]
    assert worker_counts(6) == [1, 2, 4, 6]
    assert worker_counts(16) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="max_workers"):
        worker_counts(0)


def test_knee_at_16_recommends_8():
    # 100/s per worker up to 5 workers: 1 -> 2 -> 4 (+100% each) -> 8 (+25%) -> 16 (+0%).
    model = CostModel(lambda w: 100 * min(w, 5))
    result = _tune(model, max_workers=16)
    assert _unpinned(model) == [1, 2, 4, 8, 16]
    assert result.knee_num_workers == 16
    assert result.recommended_num_workers == 8
    assert model.calls[-1] == (8, True)  # pinning tried at the recommended count only
    assert any("throughput stopped rising after 8 workers; recommending 8" in r
               for r in result.reasons), result.reasons


def test_reversal_stops_and_backs_off():
    curve = {1: 100, 2: 190, 4: 300, 8: 250, 16: 200}
    model = CostModel(curve.__getitem__)
    result = _tune(model, max_workers=16)
    assert _unpinned(model) == [1, 2, 4, 8]  # 16 is never measured
    assert (result.knee_num_workers, result.recommended_num_workers) == (8, 4)
    assert any("-16.7%" in r for r in result.reasons)


def test_small_gain_at_the_first_doubling_recommends_one_worker():
    model = CostModel({1: 100, 2: 103, 4: 400}.__getitem__)
    result = _tune(model, max_workers=4)
    assert _unpinned(model) == [1, 2]
    assert (result.knee_num_workers, result.recommended_num_workers) == (2, 1)


def test_no_knee_recommends_the_limit_and_says_so():
    model = CostModel(lambda w: 100 * w)
    result = _tune(model, max_workers=6)
    assert _unpinned(model) == [1, 2, 4, 6]
    assert result.knee_num_workers is None and result.recommended_num_workers == 6
    assert any("max_workers limit" in r for r in result.reasons)


def test_max_workers_defaults_to_the_usable_cores(monkeypatch):
    monkeypatch.setattr("gpufeed.tune._tune.usable_cores", lambda: 4)
    model = CostModel(lambda w: 100 * w)
    result = _tune(model)
    assert _unpinned(model) == [1, 2, 4]
    assert result.max_workers == 4
    model = CostModel(lambda w: 100 * w)  # above the cores only when asked for
    result = _tune(model, max_workers=8)
    assert _unpinned(model) == [1, 2, 4, 8]
    assert any("above the 4 usable cores" in r for r in result.reasons)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_a_cgroup_quota_below_the_affinity_lowers_the_usable_cores(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # a 4-CPU mask
    monkeypatch.setattr("gpufeed._engine.context._CGROUP", str(tmp_path))  # a fake cgroup v2 root
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no quota
    assert usable_cores() == 4
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 cores
    assert usable_cores() == 2
    model = CostModel(lambda w: 100 * w)
    result = _tune(model)
    assert result.max_workers == 2 and _unpinned(model) == [1, 2]
    assert any("(2 usable cores)" in r for r in result.reasons)


def test_memory_ceiling_stops_the_doubling_and_says_why():
    # Budget 0.8 x 4 GiB = 3.2 GiB; 0.5 GiB + 2 x 1 GiB fits, 0.5 GiB + 4 x 1 GiB does not.
    model = CostModel(lambda w: 100 * w, per_worker_bytes=GiB, base_bytes=GiB // 2)
    result = _tune(model, max_workers=16, available_memory_bytes=4 * GiB)
    assert _unpinned(model) == [1, 2]
    assert result.recommended_num_workers == 2 and result.knee_num_workers is None
    (why,) = [r for r in result.reasons if r.startswith("stopped before 4 workers")]
    assert "projected memory 4.5 GiB" in why and "80% of the 4.0 GiB available" in why


def test_memory_ceiling_can_leave_only_the_baseline():
    model = CostModel(lambda w: 100 * w, per_worker_bytes=10 * GiB)
    result = _tune(model, max_workers=16, available_memory_bytes=16 * GiB)
    assert _unpinned(model) == [1] and result.recommended_num_workers == 1


@pytest.mark.parametrize("speedup, pinned", [(1.10, True), (1.02, False), (0.8, False)])
def test_pin_workers_recommended_only_when_min_gain_faster(speedup, pinned):
    model = CostModel(lambda w: 100 * min(w, 5), pin_speedup=speedup)
    result = _tune(model, max_workers=16)
    assert result.recommended_pin_workers is pinned
    assert result.recommended_num_workers == 8
    assert result.recommended_row.pin_workers is pinned
    assert sum(pin for _, pin in model.calls) == 1


@pytest.mark.parametrize("wait, factor", [(0.99, 2), (0.5, 2), (0.29, 4), (0.05, 4), (0.01, 2)])
def test_prefetch_factor_from_the_data_wait(wait, factor):
    assert recommend_prefetch_factor(wait)[0] == factor
    result = _tune(CostModel(lambda w: 100 * w, wait=wait), max_workers=2)
    assert result.recommended_prefetch_factor == factor


def test_cache_rule_whole_dataset_or_nothing():
    size, why = recommend_cache_bytes(1 * GiB, "x", available_bytes=10 * GiB, loader_bytes=GiB)
    assert size == GiB and "fits" in why
    size, why = recommend_cache_bytes(5 * GiB, "x", available_bytes=10 * GiB, loader_bytes=GiB)
    assert size == 0 and "does not fit" in why
    assert recommend_cache_bytes(None, "not an image dataset", 10 * GiB, 0)[0] == 0


def test_cache_bytes_needed_by_transform(tmp_path):
    from gpufeed import RandomResizedCrop, ResizeCenterCrop
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path, num_classes=2, per_class=3, size=(40, 50))
    files = sum(p.stat().st_size for p in tmp_path.rglob("*.jpg"))
    assert cache_bytes_needed(ImageFolder(tmp_path, transform=RandomResizedCrop(16))) == (
        files, "6 encoded files")
    needed, _ = cache_bytes_needed(ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 20)))
    assert needed == 6 * 16 * 16 * 3  # decoded rows for a deterministic transform
    assert cache_bytes_needed(ImageFolder(tmp_path))[0] is None
    from torch.utils.data import Subset

    subset = Subset(ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 20)), [0, 2, 4])
    assert cache_bytes_needed(subset) == (3 * 16 * 16 * 3, "a Subset of 3 of the 6 decoded 16x16 rows")
    assert cache_bytes_needed(Subset(ImageFolder(tmp_path), [0]))[0] is None
    model = CostModel(lambda w: 100 * w)
    result = _tune(model, max_workers=1, dataset=ImageFolder(tmp_path, transform=RandomResizedCrop(16)))
    assert result.recommended_cache_bytes == files


def test_json_and_table():
    result = _tune(CostModel(lambda w: 100 * min(w, 5)), max_workers=16)
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["recommended_num_workers"] == 8
    assert [r["num_workers"] for r in data["rows"]] == [1, 2, 4, 8, 16, 8]
    assert set(data["rows"][0]) == {"num_workers", "pin_workers", "samples_per_s", "cpu_percent",
                                    "peak_memory_bytes", "memory_per_worker_bytes",
                                    "data_wait_fraction", "read_concurrency", "read_fraction",
                                    "read_latency_s", "decode_per_sample_s", "batch_samples"}
    assert data["recommended_read_concurrency"] is None  # a cost model: no dataset to set
    assert data["reasons"] == list(result.reasons)
    table = result.format_table()
    header = table.splitlines()[0].split()
    for column in ("workers", "images/s", "CPU", "memory", "data"):
        assert column in header
    assert any(line.split()[:2] == ["*", "8"] for line in table.splitlines()) and "+25.0%" in table


def test_save_plot_without_matplotlib(monkeypatch, tmp_path, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    result = _tune(CostModel(lambda w: 100 * w), max_workers=2)
    with caplog.at_level("WARNING", logger="gpufeed.tune"):
        assert result.save_plot(tmp_path / "t.png") is False
    assert not (tmp_path / "t.png").exists()
    assert "matplotlib is not installed" in caplog.text


def test_save_plot_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    result = _tune(CostModel(lambda w: 100 * w), max_workers=4)
    assert result.save_plot(tmp_path / "t.png") is True
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_fail_before_measuring():
    model = CostModel(lambda w: 100 * w)
    with pytest.raises(TypeError, match="exactly one"):
        tune(progress=False)
    with pytest.raises(TypeError, match="not both"):
        tune(lambda n, p: None, measure_fn=model, progress=False)
    with pytest.raises(TypeError, match="dataset="):
        tune(measure_fn=model, shuffle=True, progress=False)
    with pytest.raises(ValueError, match="memory_fraction"):
        tune(measure_fn=model, memory_fraction=0, progress=False)
    with pytest.raises(ValueError, match="min_gain"):
        tune(measure_fn=model, min_gain=-0.1, progress=False)
    with pytest.raises(ValueError, match="max_workers"):
        tune(measure_fn=model, max_workers=0, progress=False)
    assert model.calls == []


# ------------------------------------------------------------------------------ real runs

@pytest.fixture(scope="module")
def tiny_folder(image_folder):
    return image_folder(num_classes=2, per_class=16)


class SlowReadFolder(ImageFolder):
    """Storage with 30 ms latency per read (a sleep: no CPU), so two workers read twice as fast
    as one on any machine, however busy its cores."""

    def read(self, index: int) -> bytes:
        time.sleep(0.03)
        return super().read(index)


def _child_pids() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}


def _new_children_after(before: set[int], timeout_s: float = 10.0) -> set[int]:
    """Children that were not there before (e.g. a forkserver other tests started is), waiting up
    to ``timeout_s`` for them to go."""
    deadline = time.monotonic() + timeout_s
    while (left := _child_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_table_keeps_the_recommended_row_aligned():
    model = CostModel(lambda w: 100 * min(w, 5))
    result = _tune(model, max_workers=16)
    lines = result.format_table().splitlines()[:-1]  # the last line is the legend
    assert len({len(line) for line in lines}) == 1, "\n".join(lines)
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 1 and marked[0].split()[1] == str(result.recommended_num_workers)
    end = lines[0].index("workers") + len("workers")  # numbers right-aligned under the header
    assert all(line[end - 1].isdigit() for line in lines[1:])


class _Row:
    def __init__(self, rc, sps):
        self.read_concurrency, self.samples_per_s = rc, sps


def test_read_concurrency_search_stops_at_its_knee():
    measured = []

    def at(rc):  # storage latency hidden up to 16 reads in flight, then the decode limits
        measured.append(rc)
        return _Row(rc, 50.0 * min(rc, 12))

    best, rows, reasons = search_read_concurrency(at, _Row(1, 50.0), 0.05)
    assert measured == [4, 16, 64] and best.read_concurrency == 16
    assert "stopped helping; keeping 16" in reasons[-1] and "still help" in reasons[0]
    assert search_read_concurrency(at, _Row(16, 600.0), 0.05)[0].read_concurrency == 16
    assert measured[-1] == 64  # only values above the baseline's are tried


class SleepyJpegs(Dataset):
    """(JPEG bytes, label) after a 20 ms wait per item: slow storage behind a user dataset
    (thread-safe: the bytes are made up front)."""

    def __init__(self, n=48):
        from gpufeed.synth import encode, photo_like

        self.items = [encode(photo_like(36, 44, seed=i)) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        time.sleep(0.02)
        return self.items[i], i % 3


def test_reads_ahead_rule_from_latency_and_decode_time():
    # benchmarks/latency.py: 100 ms per read, 46 ms of decode per batch of 32 (1.44 ms/image)
    rule = reads_ahead(0.100, 0.046 / 32, 32, read_concurrency=64)
    assert (rule.needed, rule.read_concurrency, rule.prefetch_factor) == (70, 128, 4)
    rule = reads_ahead(0.030, 0.046 / 32, 32, read_concurrency=64)
    assert (rule.needed, rule.read_concurrency, rule.prefetch_factor) == (21, 64, 2)
    assert reads_ahead(10.0, 0.001, 32, read_concurrency=1).read_concurrency == 256  # at most


def test_prefetch_factor_covers_reads_longer_than_the_decode_of_the_held_tasks():
    row = TuneRow(num_workers=2, pin_workers=False, samples_per_s=900.0, cpu_percent=190.0,
                  peak_memory_bytes=GiB, memory_per_worker_bytes=GiB // 4, data_wait_fraction=0.99,
                  read_concurrency=64, read_fraction=0.5, read_latency_s=0.100,
                  decode_per_sample_s=0.046 / 32, batch_samples=32.0)
    factor, why = prefetch_for_reads(row, *recommend_prefetch_factor(row.data_wait_fraction))
    # 70 reads would keep a worker busy; 64 in flight (read_concurrency) fill two held tasks
    assert factor == 3 and why.startswith("prefetch_factor 3: a read takes 100 ms and a worker "
                                          "decodes a batch in 46 ms, so 64 reads in flight per "
                                          "worker need 2 held tasks ahead"), why
    # 16 reads in flight fit in the one task held ahead at 2; 30 ms is covered at 2
    assert prefetch_for_reads(replace(row, read_concurrency=16), 2, "w") == (2, "w")
    assert prefetch_for_reads(replace(row, read_latency_s=0.030), 2, "w") == (2, "w")
    assert prefetch_for_reads(replace(row, read_latency_s=None), 2, "w") == (2, "w")
