"""The benchmark harness measures what it claims: PSS of a process tree, clean sampler threads,
sane figures from compare()."""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed.bench.compare import batch_size_of, compare, touch_batch
from gpufeed.bench.datasets import SyntheticImageDataset
from gpufeed.bench.environment import cpu_model, describe_environment
from gpufeed.bench.memory import SAMPLER_THREAD_NAME, PeakPSS, format_bytes, tree_pss_bytes

MiB = 1 << 20

_ALLOCATE_200_MB = """
import sys, time
block = b"\\x01" * (200 << 20)   # bytes * n writes every page
print("ready", flush=True)
sys.stdin.readline()
"""


def _tree_rss_bytes() -> int:
    import psutil

    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]



def _sampled(mem: PeakPSS, more: int, timeout_s: float = 20.0) -> None:
    """Return once the sampler thread has taken ``more`` samples after this call."""
    target = mem.num_samples + more
    deadline = time.monotonic() + timeout_s
    while mem.num_samples < target:
        assert time.monotonic() < deadline, f"{mem.num_samples} of {target} samples in {timeout_s} s"
        time.sleep(mem.interval_s / 2)

@pytest.mark.timeout(60)
def test_peak_pss_sees_a_child_that_allocates_200_mb() -> None:
    with PeakPSS(interval_s=0.02) as mem:
        child = subprocess.Popen(
            [sys.executable, "-c", _ALLOCATE_200_MB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            _sampled(mem, 3)  # several samples with the block alive
        finally:
            child.communicate(input="\n", timeout=30)
    rise = mem.peak_bytes - mem.baseline_bytes
    # 200 MiB of data plus a bare interpreter (~10 MiB); not the parent's torch counted twice.
    assert 190 * MiB <= rise <= 260 * MiB, format_bytes(rise)
    assert mem.max_processes >= 2
    assert mem.num_samples >= 5
    assert mem.baseline_bytes <= mem.mean_bytes <= mem.peak_bytes
    assert mem.source in ("smaps_rollup", "psutil", "rss")


def _touch_pages_and_wait(buf: mmap.mmap, ready: mp.synchronize.Event, done: mp.synchronize.Event) -> None:
    bytes(memoryview(buf)[:: mmap.PAGESIZE])  # maps every page of the inherited mapping here too
    ready.set()
    done.wait(30)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is read from /proc (Linux)")
def test_memory_shared_with_a_child_is_counted_once() -> None:
    ctx = mp.get_context("fork")
    size = 200 * MiB
    buf = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS: shared with forked children
    try:
        before, _, source = tree_pss_bytes()
        rss_before = _tree_rss_bytes()
        if source == "rss":
            pytest.skip("PSS not readable here; RSS counts shared pages once per process")
        buf.write(b"\x02" * size)
        ready, done = ctx.Event(), ctx.Event()
        child = ctx.Process(target=_touch_pages_and_wait, args=(buf, ready, done), name="gpufeed-test-child")
        child.start()
        try:
            assert ready.wait(30)
            after, nproc, _ = tree_pss_bytes()
            rss_rise = _tree_rss_bytes() - rss_before
        finally:
            done.set()
            child.join(30)
        assert nproc >= 2
        rise = after - before
        # Both processes map all 200 MiB: RSS summed over them rises by ~400 MiB, PSS by ~200 MiB.
        assert rss_rise >= 380 * MiB, format_bytes(rss_rise)  # the set-up really shares the pages
        assert 180 * MiB <= rise <= 280 * MiB, format_bytes(rise)
    finally:
        buf.close()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs os.memfd_create (Linux)")
def test_footprint_counts_shared_memory_nobody_maps() -> None:
    fd = os.memfd_create("gpufeed-test-unmapped")
    try:
        with PeakPSS(interval_s=0.01) as mem:
            chunk = b"\x03" * MiB
            for _ in range(100):
                os.write(fd, chunk)  # shared pages exist, held by an fd, mapped by no process
            _sampled(mem, 2)
    finally:
        os.close(fd)
    if not mem.footprint_exact:
        pytest.skip("Pss_Shmem or /proc/meminfo Shmem not readable here")
    assert mem.peak_bytes - mem.baseline_bytes < 20 * MiB  # PSS cannot see them
    assert mem.peak_footprint_bytes - mem.baseline_bytes >= 90 * MiB  # the footprint does


def test_sampler_thread_is_named_and_gone_after_exit() -> None:
    mem = PeakPSS(interval_s=0.01)
    with mem:
        assert mem.running
        assert len(_sampler_threads()) == 1
        assert _sampler_threads()[0].daemon
        _sampled(mem, 1)
    assert not mem.running
    assert _sampler_threads() == []
    mem.stop()  # idempotent


def test_sampler_thread_is_gone_after_an_exception() -> None:
    with pytest.raises(KeyError):
        with PeakPSS(interval_s=0.01):
            raise KeyError("boom")
    assert _sampler_threads() == []


def test_peak_pss_rejects_bad_interval_and_double_start() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        PeakPSS(interval_s=0)
    with PeakPSS() as mem:
        with pytest.raises(RuntimeError):
            mem.start()


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * MiB) == "3.0 MiB"
    assert format_bytes(5 << 30) == "5.0 GiB"
    assert format_bytes(-2 * MiB) == "-2.0 MiB"


def test_environment_records_what_a_result_needs() -> None:
    env = describe_environment(num_workers=2)
    for key in ("gpufeed", "torch", "numpy", "cv2", "python", "cpu_model", "logical_cores", "decode_backend"):
        assert key in env
    assert env["num_workers"] == 2
    assert env["torch"] == torch.__version__
    assert isinstance(env["logical_cores"], int) and env["logical_cores"] >= 1
    json.dumps(env)  # stored in JSON results


def test_cpu_model_reads_cpuinfo(tmp_path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\nflags\t: fpu\n")
    assert cpu_model(str(f)) == "Test CPU @ 1.00GHz"
    assert cpu_model(str(tmp_path / "missing")) != ""


def test_batch_size_and_touch() -> None:
    t = torch.arange(24, dtype=torch.uint8).reshape(4, 6)
    assert batch_size_of(t) == 4
    assert batch_size_of((t, torch.zeros(4))) == 4
    assert batch_size_of({"x": t}) == 4
    assert batch_size_of([1, 2, 3]) == 3
    assert touch_batch(t) == 0
    assert touch_batch((t[1:], None)) == 6
    assert touch_batch(torch.empty(0, 3)) is None


def test_synthetic_dataset_samples() -> None:
    ds = SyntheticImageDataset(300)
    assert len(ds) == 300 and ds.sample_bytes == 3 * 224 * 224
    x = ds[257]
    assert x.shape == (3, 224, 224) and x.dtype == torch.uint8
    assert int(x.min()) == int(x.max()) == 1
    with pytest.raises(IndexError):
        ds[300]


def _list_loader(num_batches: int, delay_s: float):
    def factory():
        def gen():
            for i in range(num_batches):
                time.sleep(delay_s)
                yield torch.full((8, 3), i)
        return gen()
    return factory


def test_compare_on_two_trivial_loaders() -> None:
    result = compare(
        {"slow": _list_loader(6, 0.03), "fast": _list_loader(6, 0.002)},
        num_batches=5,
        num_rounds=3,
        num_warmup_rounds=1,
        sample_interval_s=0.01,
    )
    assert result.baseline == "slow"
    assert [s.name for s in result.loaders] == ["slow", "fast"]
    for s in result.loaders:
        assert len(s.rounds) == 3
        assert all(r.num_batches == 5 and r.num_samples == 40 for r in s.rounds)
        assert s.median_batches_per_s > 0 and s.median_samples_per_s == pytest.approx(8 * s.median_batches_per_s)
        assert s.peak_pss_bytes > 10 * MiB
    assert result.ratio("slow") == pytest.approx(1.0)
    assert result.ratio("fast") > 2  # 2 ms vs 30 ms per batch: ~10x measured on a busy 2-core box
    assert len(result.paired_ratios("fast")) == 3
    assert result.memory_ratio("fast") > 0
    d = result.to_dict()
    json.dumps(d)
    assert d["ratios"]["fast"]["batches_per_s"] == result.ratio("fast")
    table = result.format_table()
    assert "slow" in table and "fast" in table and "batches/s" in table
    assert _sampler_threads() == []


@pytest.mark.timeout(60)
def test_compare_with_worker_processes_leaves_none_behind() -> None:
    import psutil

    ds = SyntheticImageDataset(8 * 10, shape=(3, 16, 16))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = compare(
        {"DataLoader": lambda: DataLoader(ds, batch_size=8, num_workers=2)},
        num_batches=4,  # stops mid-epoch: the loader must still be torn down
        num_rounds=2,
        num_warmup_rounds=0,
    )
    s = result.summary("DataLoader")
    assert s.median_batches_per_s > 0
    assert all(r.num_samples == 32 for r in s.rounds)
    assert result.notes == ()
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert after <= before


def test_compare_validates_arguments() -> None:
    f = _list_loader(3, 0)
    with pytest.raises(ValueError, match="num_rounds"):
        compare({"a": f}, num_rounds=0)
    with pytest.raises(ValueError, match="num_batches"):
        compare({"a": f}, num_batches=1)
    with pytest.raises(ValueError, match="baseline"):
        compare({"a": f}, baseline="b")
    with pytest.raises(ValueError, match="factories"):
        compare({})
