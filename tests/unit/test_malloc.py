"""A per-sample worker sets glibc's malloc thresholds (``gpufeed.image._malloc``), so that the
buffers each sample frees are reused by the next instead of being returned to the kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpufeed.image import _sample_fill as sample_fill
from gpufeed.image._sample_fill import SampleFiller, SamplePlan
from gpufeed.image.detection import DetectionPipeline

SCRIPT = """
import ctypes, sys
from gpufeed.image._malloc import keep_freed_memory
print(keep_freed_memory())
# a 4 MiB block freed and taken again comes from the heap (no new mapping), so its pages stay
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def faults():
    return int(open("/proc/self/stat").read().split(")")[1].split()[7])
block = libc.malloc(4 << 20); ctypes.memset(block, 1, 4 << 20); libc.free(block)
before = faults()
for _ in range(20):
    block = libc.malloc(4 << 20); ctypes.memset(block, 1, 4 << 20); libc.free(block)
print(faults() - before)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_freed_blocks_are_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), check=True)
    took, faults = out.stdout.split()
    if took != "True":
        pytest.skip("not glibc: mallopt is not there")
    assert int(faults) < 50  # 0 here; about 1,000 with glibc's default thresholds (measured)


def test_the_per_sample_filler_sets_them_up_in_its_worker(monkeypatch):
    calls = []
    monkeypatch.setattr(sample_fill, "keep_freed_memory", lambda: calls.append(True) or True)
    SampleFiller(SamplePlan(DetectionPipeline(), collate_fn=list)).setup()  # what a worker runs first
    assert calls == [True]
