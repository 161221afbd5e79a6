"""Million-sample tables: workers' private memory stays flat over a full pass, the parent holds
a few bytes per sample beyond the paths, and spawn/forkserver workers map the table instead of
unpickling a copy of it."""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import tempfile
from multiprocessing.reduction import ForkingPickler

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset

from gpufeed import FastLoader
from gpufeed.image import ResizeCenterCrop
from gpufeed.sources import ImageDataset
from gpufeed.sources._shared import MEMFD_NAME
from gpufeed.synth import encode, photo_like

NUM_CHUNKS = 40
USS_GROWTH_LIMIT_BYTES = 10 << 20


def imagenet_like_pairs(n: int) -> list[tuple[str, int]]:
    """n torchvision-style (path, label) pairs with ImageNet-length paths (53 bytes)."""
    return [(f"/data/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:010d}.JPEG", i % 1000)
            for i in range(n)]


def uss() -> int:
    return int(psutil.Process().memory_full_info().uss)


class TouchEverything(Dataset):
    """Item k touches the path and label of every sample in chunk k of ``samples`` (a gpufeed
    source, or a torchvision-style list of pairs); it returns the worker's USS before and after
    (bytes), the entries touched, and whether the source's arrays are mapped from the parent."""

    def __init__(self, samples) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return NUM_CHUNKS

    def __getitem__(self, k: int):
        n = len(self.samples)
        lo, hi = k * n // NUM_CHUNKS, (k + 1) * n // NUM_CHUNKS
        before = uss()
        total = 0
        if isinstance(self.samples, list):
            for i in range(lo, hi):
                path, label = self.samples[i]
                total += len(path) + label
        else:
            for i in range(lo, hi):
                total += len(self.samples.describe(i)) + self.samples.label(i)
        mapped = -1
        if not isinstance(self.samples, list):
            mapped = int(self.samples._labels.shared_fd is not None)
        return torch.tensor([before, uss(), hi - lo, total, mapped, os.getpid()])


def worker_pass(samples, context: str) -> dict:
    """One full pass over ``samples`` in one worker: its USS growth (bytes) and what it saw."""
    loader = FastLoader(TouchEverything(samples), batch_size=None, num_workers=1,
                        multiprocessing_context=context)
    rows = torch.stack(list(loader)).tolist()
    assert len({r[5] for r in rows}) == 1  # one worker did it all
    return {"growth": max(r[1] for r in rows) - rows[0][0], "touched": sum(r[2] for r in rows),
            "total": sum(r[3] for r in rows), "mapped": {r[4] for r in rows}}


def expected_total(pairs) -> int:
    return sum(len(p) + c for p, c in pairs)


def check_flat_worker_memory(n: int, context: str) -> None:
    pairs = imagenet_like_pairs(n)
    ds = ImageDataset(pairs)
    want = expected_total(pairs)
    del pairs
    got = worker_pass(ds, context)
    assert got["touched"] == n and got["total"] == want  # every path and label was read
    if context != "fork":
        assert got["mapped"] == {1}  # the worker maps the parent's table: no copy was unpickled
    print(f"{context}: worker USS growth over {n} samples: {got['growth'] / 2**20:.2f} MiB")
    assert got["growth"] < USS_GROWTH_LIMIT_BYTES, f"{got['growth'] / 2**20:.1f} MiB"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_memory_stays_flat_over_a_full_pass_of_200k_samples(context):
    check_flat_worker_memory(200_000, context)


@pytest.mark.timeout(180)
def test_the_same_pass_over_a_torchvision_style_list_grows_the_worker():
    """The failure the tables avoid, measured the same way: refcounts dirty every page."""
    pairs = imagenet_like_pairs(200_000)
    got = worker_pass(pairs, "fork")
    assert got["touched"] == len(pairs) and got["total"] == expected_total(pairs)
    print(f"list of tuples: worker USS growth {got['growth'] / 2**20:.1f} MiB")
    assert got["growth"] > 2 * USS_GROWTH_LIMIT_BYTES


@pytest.mark.perf  # builds 1M pairs and passes over them in two workers: ~30 s on 2 busy cores
@pytest.mark.timeout(600)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_memory_stays_flat_over_a_full_pass_of_1m_samples(context):
    check_flat_worker_memory(1_000_000, context)


def _trim() -> None:
    """Collect, and give freed heap back to the OS (glibc), so USS shows what is held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def check_parent_bytes_per_sample(n: int) -> None:
    pairs = imagenet_like_pairs(n)
    path_bytes = sum(len(os.fsencode(p)) for p, _ in pairs)
    _trim()
    before = uss()
    ds = ImageDataset(pairs)
    _trim()
    held = uss() - before
    per_sample = held / n
    print(f"parent: {per_sample:.1f} B/sample held ({path_bytes / n:.0f} of them path bytes); "
          f"tables {ds._paths.nbytes + ds._labels.nbytes} B")
    assert per_sample < 100 + path_bytes / n
    assert ds._paths.nbytes + ds._labels.nbytes == path_bytes + 16 * n + 8
    del pairs


@pytest.mark.timeout(120)
def test_parent_holds_under_100_bytes_per_sample_beyond_the_paths():
    check_parent_bytes_per_sample(200_000)


@pytest.mark.perf
@pytest.mark.timeout(300)
def test_parent_holds_under_100_bytes_per_sample_beyond_the_paths_at_1m():
    check_parent_bytes_per_sample(1_000_000)


def table_fds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if MEMFD_NAME in target:
            out.append(target)
    return out


def test_a_worker_gets_a_small_handle_and_a_user_pickle_gets_the_data():
    before = table_fds()
    ds = ImageDataset(imagenet_like_pairs(200_000))
    for_worker = ForkingPickler.dumps(ds)  # what Process.start() writes under spawn/forkserver
    for_user = pickle.dumps(ds)
    print(f"pickled: {len(for_worker)} B for a worker, {len(for_user)} B with pickle.dumps")
    assert len(for_worker) < 64 << 10
    assert len(for_user) > ds._paths.nbytes + ds._labels.nbytes
    from_worker = pickle.loads(for_worker)  # maps the same pages (here: this process)
    from_user = pickle.loads(for_user)
    for other in (from_worker, from_user):
        assert len(other) == len(ds)
        assert [other.describe(i) for i in (0, 1234, 199_999)] == \
               [ds.describe(i) for i in (0, 1234, 199_999)]
        assert np.array_equal(other._labels, ds._labels) and not other._labels.flags.writeable
    # a loaded user pickle is shared again (a later spawn sends a handle for it too)
    again = ForkingPickler.dumps(from_user)
    assert len(again) < 64 << 10
    assert pickle.loads(again).describe(7) == ds.describe(7)  # (takes the handle's descriptors)
    with pytest.raises(ValueError, match="read-only"):
        from_worker._labels[0] = 5
    del ds, from_worker, from_user, other
    gc.collect()
    assert table_fds() == before  # every table's descriptor closed with its table


def named_files() -> set[str]:
    """Files a table could have left: in the temporary directory (the fallback) or /dev/shm."""
    return {os.path.join(d, f) for d in (tempfile.gettempdir(), "/dev/shm") if os.path.isdir(d)
            for f in os.listdir(d) if MEMFD_NAME in f}


def test_an_image_folder_pickles_for_a_worker_as_a_handle(tmp_path, monkeypatch):
    """ImageFolder keeps the same tables (spawn batches: test_spawn_and_forkserver_... above
    and test_image_loader); share even its small ones here (threshold 1 byte)."""
    from gpufeed.sources import ImageFolder, _shared
    from gpufeed.synth import make_image_folder

    monkeypatch.setattr(_shared, "SHARE_MIN_BYTES", 1)
    make_image_folder(tmp_path / "tree", num_classes=3, per_class=8, size=(40, 48))
    ds = ImageFolder(tmp_path / "tree", transform=ResizeCenterCrop(32))
    assert ds.labels.shared_fd is not None and ds._paths.blob.shared_fd is not None
    for_worker = ForkingPickler.dumps(ds)
    assert len(for_worker) < len(pickle.dumps(ds))
    assert pickle.loads(for_worker).samples == ds.samples


def _real_image_pairs(tmp_path, n: int) -> list[tuple[str, int]]:
    paths = []
    for k in range(6):
        p = tmp_path / f"img{k}.jpg"
        p.write_bytes(encode(photo_like(40 + 8 * k, 56, seed=k)))
        paths.append(str(p))
    return [(paths[i % len(paths)], i % 7) for i in range(n)]


@pytest.mark.timeout(180)
def test_spawn_and_forkserver_batches_equal_fork_and_leave_nothing(tmp_path):
    before_fds = table_fds()
    before_files = named_files()
    ds = ImageDataset(_real_image_pairs(tmp_path, 200_000), transform=ResizeCenterCrop(32))
    sampler = list(range(0, 200_000, 4999))  # 41 samples spread over the whole table

    def batches(ds, context):
        loader = FastLoader(ds, batch_size=8, sampler=sampler, num_workers=1,
                            multiprocessing_context=context)
        return [(x.clone(), y.clone()) for x, y in loader]

    want = batches(ds, "fork")
    assert sum(len(y) for _, y in want) == len(sampler)
    assert [int(c) for _, y in want for c in y] == [i % 7 for i in sampler]
    for context in ("spawn", "forkserver"):
        got = batches(ds, context)
        assert len(got) == len(want)
        for (gx, gy), (wx, wy) in zip(got, want):
            assert torch.equal(gx, wx) and torch.equal(gy, wy)
    del ds
    gc.collect()
    assert table_fds() == before_fds
    assert named_files() == before_files
