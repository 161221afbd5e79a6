"""The benchmark harness measuring real child processes: a child's memory, memory shared with a
child counted once, a comparison whose loaders have worker processes."""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from gpufeed.compare import format_bytes, tree_pss_bytes
from gpufeed.compare._compare import compare
from gpufeed.compare._datasets import SyntheticImageDataset
from tests.unit.test_bench_harness import _ALLOCATE_200_MB, MiB, _touch_pages_and_wait, _tree_rss_bytes

_MEASURE_A_CHILD = """
import json, subprocess, sys, time
from gpufeed.compare import PeakPSS
with PeakPSS(interval_s=0.02) as mem:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        target = mem.num_samples + 3  # several samples with the block alive
        deadline = time.monotonic() + 20
        while mem.num_samples < target and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        child.communicate(input="\\n", timeout=30)
print(json.dumps({k: getattr(mem, k) for k in ("peak_bytes", "baseline_bytes", "mean_bytes",
                  "max_processes", "num_samples", "source")}))
"""


@pytest.mark.timeout(90)
def test_peak_pss_sees_a_child_that_allocates_200_mb() -> None:
    # Measured from a fresh interpreter, so that the tree holds only it and the child: in the
    # suite's own tree, earlier tests' processes (the fork server's workers) ending inside the
    # window took their pages out of it and hid part of the child's rise (186.6 MiB seen).
    out = subprocess.run([sys.executable, "-c", _MEASURE_A_CHILD, _ALLOCATE_200_MB],
                         capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    mem = json.loads(out.stdout.strip().splitlines()[-1])
    rise = mem["peak_bytes"] - mem["baseline_bytes"]
    # 200 MiB of data plus a bare interpreter (~10 MiB); not the parent's torch counted twice.
    assert 190 * MiB <= rise <= 260 * MiB, format_bytes(rise)
    assert mem["max_processes"] >= 2
    assert mem["num_samples"] >= 5
    assert mem["baseline_bytes"] <= mem["mean_bytes"] <= mem["peak_bytes"]
    assert mem["source"] in ("smaps_rollup", "psutil", "rss")


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
