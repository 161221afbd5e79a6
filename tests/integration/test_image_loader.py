"""The image fast path end to end: FastLoader over gpufeed image datasets.

Every test checks bytes: a batch row against ``dataset[i]`` (which decodes through the same
transform in this process), a loader against another loader or against torch's DataLoader.
Images are generated once per test run in a temporary folder (photo-like JPEGs of varied sizes).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from gpufeed import (
    FastLoader,
    GpufeedWarning,
    ImageDataset,
    ImageFolder,
    LMDBDataset,
    RandomResizedCrop,
    ResizeCenterCrop,
    pack,
)

pytestmark = pytest.mark.timeout(60)

NUM_IMAGES = 42  # 3 classes x 14: batches of 8 leave a partial last batch of 2
BATCH = 8
EVAL = ResizeCenterCrop(96, 112)
TRAIN = RandomResizedCrop(80)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# -- data -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def image_root(image_folder) -> Path:
    return image_folder(num_classes=3, per_class=14, size=((230, 300), (250, 380)), seed=11)


@pytest.fixture(scope="session")
def lmdb_path(image_root, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("packed") / "images.lmdb"
    pack(image_root, path, progress=False)
    return path


@pytest.fixture(scope="session")
def big_root(image_folder) -> Path:
    """512 images of 400x350: enough work that one uncached epoch is clearly measurable."""
    return image_folder(num_classes=4, per_class=128, size=(350, 400), seed=5)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def folder(root: Path, transform=EVAL) -> ImageFolder:
    return ImageFolder(root, transform=transform)


class EncodedItems(Dataset):
    """A map-style dataset of (encoded bytes, label), as ImageDataset accepts."""

    def __init__(self, paths_labels: list[tuple[str, int]]) -> None:
        self.items = [(Path(p).read_bytes(), c) for p, c in paths_labels]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


class ReverseEachEpoch(Sampler):
    """0..n-1, then n-1..0, then 0..n-1 ...: a sequential scan that comes back to the tail first."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = range(self.n) if self.calls % 2 == 0 else range(self.n - 1, -1, -1)
        self.calls += 1
        return iter(order)


class KillsOnRead(ImageFolder):
    """Kills its own worker (SIGKILL) the first time it reads ``at`` once ``arm`` exists."""

    def __init__(self, root, transform, at: int, marker_dir: str, arm: str | None = None) -> None:
        super().__init__(root, transform=transform)
        self.at, self.marker_dir, self.arm = at, marker_dir, arm

    def read(self, index: int) -> bytes:
        if index == self.at and (self.arm is None or os.path.exists(self.arm)):
            marker = Path(self.marker_dir) / f"died-{index}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        return super().read(index)


class SlowReads(ImageFolder):
    """An image folder whose reads take ``read_s`` seconds longer (a slow disk), read one at a
    time (not the automatic default, which would read ahead once the reads stall a worker)."""

    def __init__(self, root, transform, read_s: float) -> None:
        super().__init__(root, transform=transform, read_concurrency=1)
        self.read_s = read_s

    def read(self, index: int) -> bytes:
        time.sleep(self.read_s)
        return super().read(index)


def epoch_batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch, every batch cloned (so the arena slot can be reused at once)."""
    return [(x.clone(), y.clone()) for x, y in loader]


def cat(batches) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def assert_same_batches(got, want) -> None:
    assert [tuple(x.shape) for x, _ in got] == [tuple(x.shape) for x, _ in want]
    for (gx, gy), (wx, wy) in zip(got, want):
        assert gx.dtype == wx.dtype and gy.dtype == wy.dtype
        assert torch.equal(gx, wx)
        assert torch.equal(gy, wy)


def reference_rows(ds: ImageFolder, indices, *, epoch: int = 0, seed: int = 0) -> torch.Tensor:
    """Rows computed in this process, one sample at a time (no loader)."""
    return torch.stack(
        [torch.from_numpy(ds.decode_into(i, ds.read(i), epoch=epoch, seed=seed)) for i in indices]
    )


# -- batches: shapes, labels, parity with dataset[i] and DataLoader -------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shapes_dtypes_and_labels_follow_image_folder(image_root, num_workers):
    ds = folder(image_root)
    batches = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers))
    assert [len(y) for _, y in batches] == [8, 8, 8, 8, 8, 2]
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 96, 96) and x.is_contiguous()
        assert y.dtype == torch.int64 and y.shape == (x.shape[0],)
    _, labels = cat(batches)
    assert labels.tolist() == ds.targets == sorted(ds.targets)
    assert set(ds.targets) == {0, 1, 2}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_row_i_is_dataset_getitem_i_and_dataloader_gives_the_same_bytes(image_root, num_workers):
    ds = folder(image_root)
    got = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers))
    images, labels = cat(got)
    for i in range(len(ds)):
        img, label = ds[i]
        assert torch.equal(images[i], img), f"row {i} differs from dataset[{i}]"
        assert labels[i].item() == label
    assert_same_batches(got, epoch_batches(DataLoader(ds, batch_size=BATCH)))


def test_train_rows_are_the_transform_of_seed_epoch_and_index(image_root):
    ds = folder(image_root, TRAIN)
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, seed=1234)
    for epoch in range(2):
        images, _ = cat(epoch_batches(loader))
        assert torch.equal(images, reference_rows(ds, range(len(ds)), epoch=epoch, seed=1234))


def test_transform_seed_is_the_default_and_getitem_follows_set_epoch(image_root):
    ds = folder(image_root, RandomResizedCrop(80, seed=5))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, generator=gen(99))
    epochs = [cat(epoch_batches(loader))[0] for _ in range(2)]
    for epoch, images in enumerate(epochs):
        ds.set_epoch(epoch)
        for i in (0, 17, 41):
            assert torch.equal(images[i], ds[i][0])
    assert_same_batches(
        epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=0, seed=5)),
        epoch_batches(FastLoader(folder(image_root, TRAIN), batch_size=BATCH, seed=5)),
    )


# -- determinism: num_workers, start methods, epochs, seeds --------------------------------------


@pytest.mark.parametrize("transform", [EVAL, TRAIN], ids=["eval", "train"])
def test_same_batches_for_any_num_workers(image_root, transform):
    ds = folder(image_root, transform)

    def run(num_workers: int):
        # (not persistent: torch's persistent iterator draws one base seed fewer per epoch, so
        # its shuffle order from epoch 1 on differs from num_workers=0, under DataLoader too)
        loader = FastLoader(ds, batch_size=BATCH, shuffle=True, num_workers=num_workers,
                            generator=gen(3))
        return [epoch_batches(loader) for _ in range(2)]

    want = run(0)
    for num_workers in (1, 2):
        got = run(num_workers)
        for g, w in zip(got, want):
            assert_same_batches(g, w)
    # the shuffle really shuffled, and labels travel with their images
    _, labels = cat(want[0])
    assert labels.tolist() != ds.targets and sorted(labels.tolist()) == ds.targets


@pytest.mark.timeout(90)
def test_spawn_workers_give_the_fork_batches(image_root):
    ds = folder(image_root, TRAIN)
    kw = dict(batch_size=BATCH, shuffle=True, generator=gen(8), num_workers=2)
    fork = epoch_batches(FastLoader(ds, multiprocessing_context="fork", **kw))
    kw["generator"] = gen(8)
    spawn = epoch_batches(FastLoader(ds, multiprocessing_context="spawn", **kw))
    assert_same_batches(spawn, fork)


def test_train_epochs_differ_and_set_epoch_reproduces_one(image_root):
    ds = folder(image_root, TRAIN)
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, seed=21, persistent_workers=True)
    epochs = [epoch_batches(loader) for _ in range(3)]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        ia, la = cat(epochs[a])
        ib, lb = cat(epochs[b])
        assert torch.equal(la, lb)  # same order (no shuffle), new crops
        differing = sum(not torch.equal(ia[i], ib[i]) for i in range(len(ds)))
        assert differing >= len(ds) - 2, f"epochs {a} and {b}: only {differing} rows differ"
    loader.set_epoch(1)
    assert_same_batches(epoch_batches(loader), epochs[1])
    assert_same_batches(epoch_batches(loader), epochs[2])  # and counts on from there
    fresh = FastLoader(ds, batch_size=BATCH, num_workers=0, seed=21)
    fresh.set_epoch(2)
    assert_same_batches(epoch_batches(fresh), epochs[2])
    with pytest.raises(ValueError, match="`epoch`"):
        loader.set_epoch(-1)
    loader.close()


def test_eval_epochs_are_identical(image_root):
    ds = folder(image_root)
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    first = epoch_batches(loader)
    assert_same_batches(epoch_batches(loader), first)
    loader.close()


def test_explicit_seed_equals_generator_seed_and_seeds_matter(image_root):
    ds = folder(image_root, TRAIN)
    by_seed = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=2, seed=77))
    by_generator = epoch_batches(
        FastLoader(ds, batch_size=BATCH, num_workers=2, generator=gen(77)))
    assert_same_batches(by_generator, by_seed)
    other, _ = cat(epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=0, seed=78)))
    mine, _ = cat(by_seed)
    assert sum(not torch.equal(a, b) for a, b in zip(mine, other)) >= len(ds) - 2
    # without either, the seed is torch's initial seed: the same for every loader of this process
    default_a = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=0))
    default_b = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=2))
    assert_same_batches(default_b, default_a)
    seed = torch.initial_seed() % (1 << 63)
    assert_same_batches(default_a, epoch_batches(FastLoader(ds, batch_size=BATCH, seed=seed)))


# -- layout and dtype -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_channels_last_same_values_nhwc_memory(image_root, num_workers):
    ds = folder(image_root, TRAIN)
    plain = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers, seed=4))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers, seed=4, channels_last=True)
    for (x, y), (px, py) in zip(loader, plain):
        assert x.shape == px.shape and x.dtype == torch.uint8
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert not x.is_contiguous()
        assert torch.equal(x, px) and torch.equal(y, py)


# Largest |error| against a float64 reference of (x / 255 - mean) / std, whose values lie in
# [-2.2, 2.7): about 3 units in the last place of the dtype at magnitudes in [2, 4).
TOLERANCES = {torch.float32: 1e-6, torch.float16: 6e-3, torch.bfloat16: 5e-2}


def assert_within(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    """max |got - want| <= atol (torch.testing.assert_close costs ~0.1 s a call here)."""
    err = (got.double() - want.double()).abs().max().item()
    assert err <= atol, f"max abs error {err:.3g} > {atol:.3g}"


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_normalize_matches_torch_reference(image_root, dtype, num_workers):
    ds = folder(image_root)
    raw = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers, normalize=(MEAN, STD),
                        dtype=dtype)
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    atol = TOLERANCES[dtype]
    n = 0
    for (x, y), (u8, uy) in zip(loader, raw):
        assert x.dtype == dtype and x.shape == u8.shape and x.is_contiguous()
        assert torch.equal(y, uy)
        want = (u8.double() / 255 - mean) / std
        assert_within(x, want, atol)
        n += len(x)
    assert n == len(ds)


def test_normalize_defaults_to_float32_and_keeps_channels_last(image_root):
    ds = folder(image_root)
    u8, _ = cat(epoch_batches(FastLoader(ds, batch_size=BATCH)))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, normalize=(MEAN, STD),
                        channels_last=True)
    got = []
    for x, _ in loader:
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        got.append(x.clone())
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    assert_within(torch.cat(got), (u8.double() / 255 - mean) / std, TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
def test_float_dtype_without_normalize_is_x_over_255(image_root, dtype):
    ds = folder(image_root)
    u8, _ = cat(epoch_batches(FastLoader(ds, batch_size=BATCH)))
    x, _ = cat(epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=2, dtype=dtype)))
    assert x.dtype == dtype
    assert_within(x, u8.double() / 255, torch.finfo(dtype).eps)  # one unit in the last place at 1
    assert x.min() >= 0 and x.max() <= 1


# -- the host cache -------------------------------------------------------------------------------


def row_bytes(transform) -> int:
    h, w = transform.output_size
    return 3 * h * w


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cache_of_half_the_set_respects_its_budget_and_counts_hits(image_root, num_workers):
    ds = folder(image_root)
    n, k = len(ds), len(ds) // 2
    budget = k * row_bytes(EVAL)  # room for exactly k decoded rows
    loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers, cache_bytes=budget,
                        sampler=ReverseEachEpoch(n), persistent_workers=num_workers > 0)
    forward = epoch_batches(FastLoader(ds, batch_size=BATCH))
    seen = []
    for epoch in range(2):
        got = []
        for x, y in loader:
            got.append((x.clone(), y.clone()))
            seen.append(loader.stats()["cache_bytes"])
        if epoch == 0:
            assert_same_batches(got, forward)
        else:  # backwards: rows n-1 .. 0, the first k of them served by the cache
            images, labels = cat(got)
            want_images, want_labels = cat(forward)
            assert torch.equal(images, want_images.flip(0))
            assert torch.equal(labels, want_labels.flip(0))
    assert max(seen) <= budget
    stats = loader.stats()
    assert stats["cache_bytes"] == budget  # full: exactly k rows
    # epoch 0 misses everything and keeps the last k; epoch 1 comes back through exactly those k
    assert stats["cache_hits"] == k
    assert stats["cache_misses"] == n + (n - k)
    assert stats["cache_hit_rate"] == pytest.approx(k / (2 * n))
    assert stats["images"] == 2 * n
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_whole_eval_set_cached_decoded_is_byte_identical(image_root, num_workers):
    ds = folder(image_root)
    want = epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers, cache_bytes="64MB",
                        persistent_workers=num_workers > 0)
    for epoch in range(3):
        assert_same_batches(epoch_batches(loader), want)
        stats = loader.stats()
        assert stats["cache_hits"] == epoch * len(ds)
        assert stats["cache_misses"] == len(ds)
        assert stats["cache_bytes"] == len(ds) * row_bytes(EVAL)  # decoded rows, not files
    assert stats["cache_hit_rate"] == pytest.approx(2 / 3)
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_cache_holds_encoded_bytes_and_batches_are_identical(image_root, num_workers):
    ds = folder(image_root, TRAIN)
    kw = dict(batch_size=BATCH, num_workers=num_workers, shuffle=True, seed=9,
              persistent_workers=num_workers > 0)
    plain = FastLoader(ds, generator=gen(1), **kw)
    cached = FastLoader(ds, generator=gen(1), cache_bytes=16 << 20, **kw)
    file_bytes = sum(os.path.getsize(ds.path(i)) for i in range(len(ds)))
    for epoch in range(3):
        assert_same_batches(epoch_batches(cached), epoch_batches(plain))
        stats = cached.stats()
        assert stats["cache_bytes"] == file_bytes  # encoded files, whatever the crop
        assert stats["cache_hits"] == epoch * len(ds) and stats["cache_misses"] == len(ds)
    plain.close()
    cached.close()


def test_train_cache_budget_is_respected(image_root):
    ds = folder(image_root, TRAIN)
    sizes = [os.path.getsize(ds.path(i)) for i in range(len(ds))]
    budget = sum(sizes) // 2
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, shuffle=True, seed=2,
                        cache_bytes=budget, generator=gen(2))
    plain = FastLoader(ds, batch_size=BATCH, num_workers=0, shuffle=True, seed=2,
                       generator=gen(2))
    for _ in range(2):
        got = []
        for x, y in loader:
            got.append((x.clone(), y.clone()))
            assert 0 < loader.stats()["cache_bytes"] <= budget
        assert_same_batches(got, epoch_batches(plain))
    stats = loader.stats()
    assert stats["cache_bytes"] > budget - max(sizes)  # an LRU at its budget is nearly full
    assert stats["cache_hits"] + stats["cache_misses"] == 2 * len(ds)
    loader.close()


def test_cache_bytes_accepts_sizes_and_shares(image_root):
    ds = folder(image_root)
    for value in ("64MB", "1GiB", "5%", 10**8):
        loader = FastLoader(ds, batch_size=BATCH, cache_bytes=value)
        assert len(epoch_batches(loader)) == 6
        assert loader.stats()["cache_bytes"] == len(ds) * row_bytes(EVAL)
    with pytest.raises(ValueError, match="`cache_bytes`"):
        FastLoader(ds, batch_size=BATCH, cache_bytes="lots")
    with pytest.raises(ValueError, match="`cache_bytes`"):
        FastLoader(ds, batch_size=BATCH, cache_bytes=-1)


@pytest.mark.perf  # a speed ratio; the cache's counts and bytes are checked above
@pytest.mark.timeout(120)
def test_second_epoch_from_a_full_eval_cache_is_10x_faster(big_root):
    ds = ImageFolder(big_root, transform=ResizeCenterCrop(224, 256))
    assert len(ds) == 512
    loader = FastLoader(ds, batch_size=64, num_workers=2, persistent_workers=True,
                        cache_bytes="1GB")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        n = 0
        for x, _ in loader:
            n += len(x)
        times.append(time.perf_counter() - t0)
        assert n == 512
    stats = loader.stats()
    assert stats["cache_hits"] == 2 * 512 and stats["cache_misses"] == 512
    speedup = times[0] / statistics.median(times[1:])
    print(f"epoch times {['%.3f s' % t for t in times]}: cached epochs {speedup:.1f}x faster")
    assert speedup >= 10, f"epoch times {times}: only {speedup:.1f}x"
    loader.close()


# -- other sources --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("transform", [EVAL, TRAIN], ids=["eval", "train"])
def test_lmdb_and_image_dataset_give_the_image_folder_batches(image_root, lmdb_path, num_workers,
                                                              transform):
    reference = folder(image_root, transform)
    samples = reference.samples
    sources = {
        "lmdb": LMDBDataset(lmdb_path, transform=transform),
        "paths": ImageDataset(samples, transform=transform),
        "torchvision-like": ImageDataset(reference, transform=transform),
        "bytes": ImageDataset(EncodedItems(samples), transform=transform),
    }

    def run(ds):
        return epoch_batches(FastLoader(ds, batch_size=BATCH, num_workers=num_workers, shuffle=True,
                                        generator=gen(6)))

    want = run(reference)
    for name, ds in sources.items():
        assert len(ds) == len(reference), name
        assert_same_batches(run(ds), want)


# -- memory, options, fallbacks -------------------------------------------------------------------


@pytest.mark.parametrize("cache", [None, "64MB"])
def test_arena_memory_and_slots_stay_bounded_over_epochs(image_root, cache):
    ds = folder(image_root, TRAIN)
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True,
                        cache_bytes=cache)
    in_flight = 2 * 2 + 2  # prefetch_factor x num_workers, plus the batches being consumed
    ids, resident, batch_bytes = [], [], 0
    for _ in range(6):
        for x, y in loader:
            assert x.shape[0] == y.shape[0]
            batch_bytes = max(batch_bytes, x.untyped_storage().nbytes())
        ids.append(loader._arena.num_slots)
        resident.append(loader._arena.resident_bytes())
    page = os.sysconf("SC_PAGE_SIZE")
    staged = 0 if cache is None else BATCH * max(p.stat().st_size for p in image_root.rglob("*.jpg"))
    slot_pages = -(-(batch_bytes + staged) // page) * page  # the encoded cache stages files in slots
    assert max(resident) <= in_flight * slot_pages, f"resident bytes per epoch: {resident}"
    # ids: each task in flight holds a cold fallback, warm slots circulate besides
    assert max(ids) <= 2 * in_flight, f"arena slot ids per epoch: {ids}"
    loader.close()


def test_tasks_waiting_in_worker_queues_hold_no_memory(image_root):
    """Slots are bound when a worker starts writing, not when a task is queued: with 8 tasks in
    flight, a loader that is waited on keeps about one slot per worker plus the user's batch.
    Reads are slowed (sleeping, not computing) so the consumer is always the one waiting, also
    on a loaded machine: workers that ran ahead would fill slots with finished batches."""
    ds = SlowReads(image_root, TRAIN, read_s=0.01)
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, prefetch_factor=4,
                        persistent_workers=True)
    peak = batch_bytes = 0
    for _ in range(3):
        for x, _ in loader:
            batch_bytes = max(batch_bytes, x.untyped_storage().nbytes())
            peak = max(peak, loader._arena.resident_bytes())
    page = os.sysconf("SC_PAGE_SIZE")
    slot_pages = -(-batch_bytes // page) * page
    assert peak <= 6 * slot_pages < (4 * 2 + 1) * slot_pages, f"peak resident {peak / slot_pages:.1f} slots"
    loader.close()


IMAGE_OPTIONS = [
    ("channels_last", True),
    ("normalize", (MEAN, STD)),
    ("dtype", torch.float16),
    ("on_error", "skip"),
    ("cache_bytes", "1MB"),
    ("seed", 3),
]


@pytest.mark.parametrize("name,value", IMAGE_OPTIONS, ids=[n for n, _ in IMAGE_OPTIONS])
def test_image_options_on_a_non_image_dataset_raise_naming_the_option(image_root, name, value):
    tensors = TensorDataset(torch.zeros(8, 3), torch.arange(8))
    with pytest.raises(ValueError, match=f"`{name}`.*TensorDataset"):
        FastLoader(tensors, batch_size=2, num_workers=2, **{name: value})
    with pytest.raises(ValueError, match=f"`{name}`.*no transform"):
        FastLoader(ImageFolder(image_root), batch_size=2, **{name: value})
    with pytest.raises(ValueError, match=f"`{name}`.*collate_fn"):
        FastLoader(folder(image_root), batch_size=2, collate_fn=list, **{name: value})


def test_bad_image_option_values_raise_at_construction(image_root):
    ds = folder(image_root)
    with pytest.raises(ValueError, match="`on_error`"):
        FastLoader(ds, batch_size=2, on_error="ignore")
    with pytest.raises(ValueError, match="`dtype`"):
        FastLoader(ds, batch_size=2, dtype=torch.int32)
    with pytest.raises(ValueError, match="`normalize`"):
        FastLoader(ds, batch_size=2, normalize=((0.5, 0.5), (0.5, 0.5)))


def labels_and_sizes(batch):
    """A custom collate: (list of image sizes, label tensor)."""
    return [tuple(img.shape) for img, _ in batch], torch.tensor([label for _, label in batch])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_collate_on_image_folder_takes_the_generic_path(image_root, num_workers):
    ds = folder(image_root)
    with pytest.warns(GpufeedWarning, match=r"generic path .* a custom collate_fn is used "
                                            r"\(labels_and_sizes\); drop it for the fast path"):
        loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers, collate_fn=labels_and_sizes)
    got = list(loader)
    want = list(DataLoader(ds, batch_size=BATCH, collate_fn=labels_and_sizes))
    assert len(got) == len(want) == 6
    for (gs, gl), (ws, wl) in zip(got, want):
        assert gs == ws == [(3, 96, 96)] * len(gl)
        assert torch.equal(gl, wl)
    # the default collate over the same generic path stacks exactly the fast path's rows
    from torch.utils.data import default_collate

    with pytest.warns(GpufeedWarning, match="collate_fn"):
        loader = FastLoader(ds, batch_size=BATCH, num_workers=num_workers,
                            collate_fn=lambda b: default_collate(b))
    generic = epoch_batches(loader)
    assert_same_batches(generic, epoch_batches(FastLoader(ds, batch_size=BATCH)))


def test_image_folder_without_transform_yields_full_images(image_root):
    ds = ImageFolder(image_root)
    with pytest.warns(GpufeedWarning, match="no transform"):
        loader = FastLoader(ds, batch_size=None, num_workers=2)
    for i, (img, label) in enumerate(loader):
        assert img.dtype == torch.uint8 and img.shape[0] == 3 and img.shape[1] >= 230
        assert label == ds.targets[i]
    assert i == len(ds) - 1


# -- worker death ---------------------------------------------------------------------------------


def test_worker_killed_on_read_every_image_once_and_identical(image_root, tmp_path):
    ds = KillsOnRead(image_root, TRAIN, at=19, marker_dir=str(tmp_path))
    kw = dict(batch_size=BATCH, shuffle=True, seed=13, num_workers=2)
    loader = FastLoader(ds, generator=gen(4), **kw)
    got = epoch_batches(loader)
    assert (tmp_path / "died-19").exists()
    assert loader.stats()["worker_restarts"] == 1
    clean = epoch_batches(FastLoader(folder(image_root, TRAIN), generator=gen(4), **kw))
    assert_same_batches(got, clean)
    _, labels = cat(got)
    assert sorted(labels.tolist()) == ds.targets
    assert loader.stats()["images"] == len(ds)


def test_worker_killed_after_taking_a_warm_slot_loses_no_slot(image_root, tmp_path):
    """Sample 19 is 4th in its batch: the worker has bound a warm slot (and said so) when it dies.
    The batch is re-run elsewhere and that slot goes back to the free slots."""
    ds = KillsOnRead(image_root, TRAIN, at=19, marker_dir=str(tmp_path))
    kw = dict(batch_size=BATCH, num_workers=2, seed=2)
    loader = FastLoader(ds, persistent_workers=True, **kw)
    first = epoch_batches(loader)
    got = epoch_batches(loader)  # warm slots exist from epoch 0: the death happens in epoch 1
    assert (tmp_path / "died-19").exists() and loader.stats()["worker_restarts"] == 1
    want = FastLoader(folder(image_root, TRAIN), persistent_workers=True, **kw)
    assert_same_batches(first, epoch_batches(want))
    assert_same_batches(got, epoch_batches(want))
    arena = loader._arena
    assert arena.free_slots() == arena.num_slots  # every batch dropped: every slot is free
    loader.close()
    want.close()


def test_worker_killed_mid_batch_with_cache_hits_is_identical(image_root, tmp_path):
    """Epoch 1 walks back through a half-full decoded cache; the worker dies in the batch that
    mixes hits (rows the parent wrote) and misses, and the batch is re-run into the same slot."""
    n, k = NUM_IMAGES, 20
    arm = tmp_path / "armed"
    ds = KillsOnRead(image_root, EVAL, at=n - k - 1, marker_dir=str(tmp_path), arm=str(arm))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, sampler=ReverseEachEpoch(n),
                        cache_bytes=k * row_bytes(EVAL), persistent_workers=True)
    forward = epoch_batches(loader)
    arm.write_text("")
    backward = epoch_batches(loader)
    assert (tmp_path / f"died-{n - k - 1}").exists()
    assert loader.stats()["worker_restarts"] == 1
    want = epoch_batches(FastLoader(folder(image_root), batch_size=BATCH))
    assert_same_batches(forward, want)
    images, labels = cat(backward)
    want_images, want_labels = cat(want)
    assert torch.equal(images, want_images.flip(0)) and torch.equal(labels, want_labels.flip(0))
    loader.close()



def test_cache_counters_are_exact_after_a_worker_death(image_root, tmp_path):
    """Each sample is looked up once per epoch, also when its batch is re-run after a death."""
    n, k = NUM_IMAGES, 20
    arm = tmp_path / "armed"
    ds = KillsOnRead(image_root, EVAL, at=n - k - 1, marker_dir=str(tmp_path), arm=str(arm))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, sampler=ReverseEachEpoch(n),
                        cache_bytes=k * row_bytes(EVAL), persistent_workers=True)
    epoch_batches(loader)
    arm.write_text("")
    epoch_batches(loader)
    assert loader.stats()["worker_restarts"] == 1
    stats = loader.stats()
    assert (stats["cache_hits"], stats["cache_misses"]) == (k, n + (n - k))
    loader.close()


@pytest.mark.parametrize("path", ["image", "generic"])
def test_break_mid_epoch_strands_no_slot(image_root, path):
    """Workers finish their queued tasks while they shut down, taking warm slots as they go: the
    parent reads those claims before it closes the pipes, so every slot comes back."""
    ds = folder(image_root, TRAIN) if path == "image" else TensorDataset(torch.arange(4096.0).view(256, 16))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, prefetch_factor=2)
    for _ in range(4):
        for k, _batch in enumerate(loader):
            if k == 1:
                break
        del _batch
    arena = loader._arena
    assert arena.free_slots() == arena.num_slots
    loader.close()

