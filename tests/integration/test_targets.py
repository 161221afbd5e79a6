"""Targets of any type on the image fast path: batches equal ``DataLoader``'s, for any
``num_workers``, through a cache, a resume and a worker's death; ``target_transform`` in workers.

Every loader here takes the image path (checked): the images are the gpufeed transform's
bytes, which ``dataset[i]`` gives too, so ``DataLoader`` over the same dataset with the default
collate is the reference for the whole batch, images and targets, types included.
"""

from __future__ import annotations

import os
import random
import signal
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed import FastLoader, ImageDataset, ImageFolder, RandomResizedCrop, ResizeCenterCrop

from ._batches import interrupted

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:This DataLoader will create")]

BATCH = 4  # 14 images: three batches of 4 and one of 2
EVAL = ResizeCenterCrop(24, 28)
Box = namedtuple("Box", ["label", "score"])


@pytest.fixture(scope="module")
def root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=7, size=((60, 90), (70, 100)), seed=31)


def paths(root: Path) -> list[str]:
    return [path for path, _ in ImageFolder(root).samples]


TARGETS: dict[str, Any] = {  # name -> target of sample i
    "int": lambda i: i * 3,
    "float": lambda i: i / 7,
    "bool": lambda i: i % 2 == 0,
    "str": lambda i: f"caption {i}",
    "bytes": lambda i: b"\x00" * i,
    "tuple": lambda i: (i, f"s{i}"),
    "namedtuple": lambda i: Box(i, i * 0.5),
    "dict": lambda i: {"label": i, "name": f"n{i}", "weights": [i, i + 1]},
    "tensor": lambda i: torch.arange(5, dtype=torch.float16) * i,
    "numpy": lambda i: np.full((2, 3), i, np.int32),
    "nested": lambda i: {"boxes": torch.ones(3, 4) * i, "meta": (f"m{i}", {"k": i / 2})},
    "none": lambda i: None,
}


def assert_equal(got: Any, want: Any, where: str = "batch") -> None:
    """Equal values of the same types, down to every leaf (a tensor's dtype and shape included)."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, where
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), where
        return
    if isinstance(want, (list, tuple)) and not isinstance(got, (list, tuple)):
        raise AssertionError(f"{where}: {type(got).__name__} for {type(want).__name__}")
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want)):
            assert_equal(g, w, f"{where}[{k}]")
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__} for {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_equal(got[k], want[k], f"{where}[{k!r}]")
        return
    assert got == want, where


def assert_batches(got: list[Any], want: list[Any]) -> None:
    """FastLoader's ``(images, targets)`` against DataLoader's ``[images, targets]``; the
    targets' container types are compared exactly (a namedtuple stays one, a tuple is a list
    in default_collate's output as in DataLoader's)."""
    assert len(got) == len(want)
    for k, ((images, targets), (want_images, want_targets)) in enumerate(zip(got, want)):
        assert torch.equal(images, want_images), f"batch {k}: images"
        assert_equal(targets, want_targets, f"batch {k}: targets")
        if isinstance(want_targets, (list, tuple)):
            assert type(targets) is type(want_targets), f"batch {k}: {type(targets).__name__}"


def image_path_loader(dataset: Any, **kw: Any) -> FastLoader:
    loader = FastLoader(dataset, batch_size=BATCH, **kw)
    assert loader._image_path, "the loader should take the image path"
    return loader


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_image_dataset_targets_equal_dataloader(root, kind, num_workers):
    make = TARGETS[kind]
    ds = ImageDataset([(p, make(i)) for i, p in enumerate(paths(root))], transform=EVAL)
    assert ds.int_targets == (kind == "int")
    if kind == "none":  # default_collate takes no None: the same TypeError as DataLoader's
        with pytest.raises(TypeError, match="default_collate: batch must contain"):
            list(DataLoader(ds, batch_size=BATCH))
        with pytest.raises(TypeError, match="default_collate: batch must contain"):
            list(image_path_loader(ds, num_workers=num_workers))
        return
    got = list(image_path_loader(ds, num_workers=num_workers))
    assert_batches(got, list(DataLoader(ds, batch_size=BATCH)))


def to_record(y: int) -> dict[str, Any]:
    return {"y": y, "name": f"class {y}", "half": y / 2, "vec": torch.full((2,), y), "pair": (y, -y)}


class WrappedItems(torch.utils.data.Dataset):
    """A dataset of (encoded bytes, target) items, the targets of every kind at once."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[bytes, Any]:
        with open(self.files[i], "rb") as f:
            return f.read(), {kind: make(i) for kind, make in TARGETS.items() if kind != "none"}


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_target_transform_and_wrapped_items_equal_dataloader_for_any_num_workers(root, num_workers):
    folder = ImageFolder(root, transform=EVAL, target_transform=to_record)
    wrapped = ImageDataset(WrappedItems(paths(root)), transform=EVAL)
    assert folder.int_targets and not wrapped.int_targets  # the transform decides the route
    for ds in (folder, wrapped):
        got = list(image_path_loader(ds, num_workers=num_workers, shuffle=True,
                                     generator=torch.Generator().manual_seed(2)))
        assert_batches(got, list(DataLoader(ds, batch_size=BATCH, shuffle=True,
                                            generator=torch.Generator().manual_seed(2))))


def test_int_labels_keep_their_route_and_a_target_transform_takes_the_other(root):
    for ds, route in ((ImageFolder(root, transform=EVAL), "labels"),
                      (ImageDataset(ImageFolder(root), transform=EVAL), "labels"),
                      (ImageFolder(root, transform=EVAL, target_transform=str), "collate")):
        loader = image_path_loader(ds)
        batches = list(loader)
        assert loader._image_feed.plan.targets == route
        assert_batches(batches, list(DataLoader(ds, batch_size=BATCH)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cached_epochs_keep_their_targets(root, num_workers):
    """The decoded cache writes every row of the second epoch; the targets are collated in
    the workers all the same (no batch is made in the parent)."""
    ds = ImageFolder(root, transform=EVAL, target_transform=to_record)
    loader = image_path_loader(ds, num_workers=num_workers, cache_bytes="16MB", cache_scope="rank",
                               persistent_workers=num_workers > 0)
    want = list(DataLoader(ds, batch_size=BATCH))
    for _ in range(2):
        assert_batches(list(loader), want)
    assert loader.stats()["cache_hits"] == len(ds)
    loader.close()


def test_skipped_samples_drop_their_targets(root, tmp_path):
    files = paths(root)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    pairs = [(p, f"t{i}") for i, p in enumerate(files)]
    pairs.insert(5, (str(bad), "bad"))
    ds = ImageDataset(pairs, transform=EVAL)
    got = list(image_path_loader(ds, num_workers=2, on_error="skip"))
    assert [len(images) for images, _ in got] == [len(targets) for _, targets in got] == [4, 3, 4, 3]
    assert [t for _, targets in got for t in targets] == [f"t{i}" for i in range(len(files))]


class FailsOn:
    """A target_transform that raises for one label."""

    def __init__(self, label: int) -> None:
        self.label = label

    def __call__(self, y: int) -> int:
        if y == self.label:
            raise KeyError(f"no name for label {y}")
        return y


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_target_transform_names_stage_worker_sample_and_file(root, num_workers):
    ds = ImageFolder(root, transform=EVAL, target_transform=FailsOn(1))
    first = ds.targets.index(1)
    with pytest.raises(KeyError, match="no name for label 1") as info:
        list(image_path_loader(ds, num_workers=num_workers))
    text = notes(info.value)
    assert "target_transform (FailsOn)" in text
    assert f"sample index {first} ({ds.path(first)})" in text
    if num_workers:
        assert "raised in worker" in text and "pid" in text


def drawing(y: int) -> tuple[int, float, float, int]:
    """A random target_transform: draws from torch, random and numpy in its process."""
    return y, torch.rand(()).item(), random.random(), int(np.random.randint(1000))


def random_loader(root: Path, num_workers: int) -> FastLoader:
    return image_path_loader(ImageFolder(root, transform=RandomResizedCrop(20), target_transform=drawing),
                             num_workers=num_workers, shuffle=True, seed=4,
                             generator=torch.Generator().manual_seed(8))


def test_random_target_transform_draws_as_under_dataloader(root):
    """Workers are seeded as torch seeds them, and each runs target_transform in batch order, so
    the draws are DataLoader's (the images come from (seed, epoch, index) alone)."""
    ds = ImageFolder(root, transform=RandomResizedCrop(20), target_transform=drawing)
    got = [targets for _, targets in random_loader(root, 2)]
    want = [targets for _, targets in DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                                  generator=torch.Generator().manual_seed(8))]
    assert_equal(got, want)


@pytest.mark.parametrize("k", [1, 2])
def test_resume_is_exact_with_a_random_target_transform(root, k):
    full = list(random_loader(root, 3))
    head, state = interrupted(random_loader(root, 3), k)
    assert_batches(head, full[:k])
    resumed = random_loader(root, 3)
    resumed.load_state_dict(state)
    assert_batches(list(resumed), full[k:])


class Recording:
    """``to_record``, appending each call's target to a file (one line per call)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, y: int) -> dict[str, Any]:
        with open(self.path, "a") as f:
            f.write(f"{y}\n")
        return to_record(y)


def test_a_worker_killed_mid_epoch_reruns_its_batches_once(root, tmp_path):
    calls = tmp_path / "calls.txt"
    pairs = [(p, i) for i, p in enumerate(paths(root))]  # target: the sample index
    want = list(DataLoader(ImageDataset(pairs, transform=EVAL, target_transform=to_record), batch_size=2))
    ds = ImageDataset(pairs, transform=EVAL, target_transform=Recording(str(calls)))
    loader = FastLoader(ds, batch_size=2, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    got = []
    for k, batch in enumerate(it):
        got.append(batch)
        if k == 2:
            os.kill(it.worker_pids[1], signal.SIGKILL)
    assert_batches(got, want)  # the re-run batches are the same, bytes and targets
    assert it.worker_restarts == 1
    assert [y for _, targets in got for y in targets["y"].tolist()] == list(range(len(ds)))
    runs = [int(y) for y in calls.read_text().split()]
    twice = sorted({y for y in runs if runs.count(y) == 2})
    # Each sample's target_transform ran once, and again only where the killed worker had run it
    # for a batch it never answered: those batches (at most its 2 in flight) ran once more.
    assert set(runs) == set(range(len(ds))) and max(map(runs.count, runs)) <= 2
    assert len(runs) == len(ds) + len(twice) and len({y // 2 for y in twice}) <= 2


# -- tar shards ------------------------------------------------------------------------------------


def write_shards(root: Path, tmp: Path) -> list[Path]:
    """Two shards of the folder's images, each sample with .cls, .txt, .json and .meta members."""
    import io
    import json
    import tarfile

    files = paths(root)
    shards = [tmp / "s-0.tar", tmp / "s-1.tar"]
    for s, shard in enumerate(shards):
        with tarfile.open(shard, "w") as tf:
            for i in range(s * 7, s * 7 + 7):
                with open(files[i], "rb") as f:
                    image = f.read()
                members = {"jpg": image, "cls": f" {i % 3}\n".encode(), "txt": f"caption {i} é".encode(),
                           "json": json.dumps({"y": i, "tags": [f"t{i}", "x"], "w": i / 4}).encode(),
                           "meta": bytes([i, 255, 0])}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"k{i:04d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return shards


def json_pair(sample: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    import json

    return sample["__key__"], json.loads(sample["json"])


@pytest.fixture(scope="module")
def shards(root, tmp_path_factory) -> list[Path]:
    return write_shards(root, tmp_path_factory.mktemp("shards"))


@pytest.mark.parametrize(("label", "first"), [
    ("cls", 0), ("txt", "caption 0 é"), ("meta", b"\x00\xff\x00"),
    (json_pair, ("k0000", {"y": 0, "tags": ["t0", "x"], "w": 0.0})),
])
def test_tar_targets_decode_as_webdataset_and_batch_as_dataloader(shards, label, first):
    from gpufeed import TarShards

    ds = TarShards(shards, transform=EVAL, label=label)
    assert ds.int_targets == (label == "cls") and ds.target(0) == first
    for num_workers in (0, 2):
        got = list(image_path_loader(ds, num_workers=num_workers))
        assert_batches(got, list(DataLoader(ds, batch_size=BATCH)))


def test_tar_json_targets_are_kept_by_the_index_cache(shards, tmp_path):
    from gpufeed import TarShards

    cache = tmp_path / "index.npz"
    first = TarShards(shards, transform=EVAL, label="json", index_cache=cache)
    assert cache.exists()
    again = TarShards(shards, transform=EVAL, label="json", index_cache=cache)
    assert again.targets == first.targets and again.target(3) == {"y": 3, "tags": ["t3", "x"], "w": 0.75}
    assert_batches(list(image_path_loader(again, num_workers=2)), list(DataLoader(first, batch_size=BATCH)))


def test_a_label_function_of_objects_keeps_no_index_cache(shards, tmp_path):
    """Its results would be pickles in the cache file, which is a plain .npz."""
    from gpufeed import TarShards

    cache = tmp_path / "index.npz"
    ds = TarShards(shards, label=json_pair, index_cache=cache)
    assert not cache.exists() and ds.target(1)[0] == "k0001"
    TarShards(shards, label=lambda s: int(s["cls"]), index_cache=cache)  # ints: kept
    assert cache.exists()
