"""Corrupt, truncated, empty and non-image files on the image fast path.

``on_error="raise"``: a ``DecodeError`` naming the file and the sample index, in the main
process, with or without workers. ``on_error="skip"``: the bad samples are left out of their
batch, counted, and logged once per file. Unusual but valid files (PNG, PNG bytes named .jpg,
CMYK JPEG) decode like any other. Never a hang (timeouts), never a crash of the main process.
"""

from __future__ import annotations

import gc
import io
import logging
import resource
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from gpufeed import DecodeError, FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop
from gpufeed.synth import encode, photo_like
from tests._procs import live_children

pytestmark = pytest.mark.timeout(60)

EVAL = ResizeCenterCrop(64, 72)
BAD = ("img_00002_truncated.jpg", "img_00004_empty.jpg", "img_00001_text.jpg")


@pytest.fixture(scope="session")
def root(image_folder) -> Path:
    """class_00 and class_01 with 6 good JPEGs each, three bad files and three unusual good ones."""
    root = image_folder(num_classes=2, per_class=6, size=((200, 240), (220, 300)), seed=2, private=True)
    jpeg = encode(photo_like(210, 280, seed=7))
    (root / "class_00" / BAD[0]).write_bytes(jpeg[: len(jpeg) // 2])
    (root / "class_00" / BAD[1]).write_bytes(b"")
    (root / "class_01" / BAD[2]).write_bytes(b"<html><body>404 Not Found</body></html>\n" * 8)
    (root / "class_01" / "img_00003_lossless.png").write_bytes(encode(unusual_image(), "png"))
    (root / "class_01" / "img_00003_png_named.jpg").write_bytes(encode(unusual_image(), "png"))
    cmyk = cmyk_jpeg(unusual_image())
    if cmyk is not None:
        (root / "class_01" / "img_00005_cmyk.jpg").write_bytes(cmyk)
    return root


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def unusual_image() -> np.ndarray:
    return photo_like(230, 260, seed=9)


def cmyk_jpeg(rgb: np.ndarray) -> bytes | None:
    """A 4-component (Adobe CMYK) JPEG written by Pillow, or None if this Pillow cannot."""
    from PIL import Image

    buf = io.BytesIO()
    try:
        Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=95)
    except (OSError, KeyError, ValueError):
        return None
    return buf.getvalue()


def bad_indices(ds: ImageFolder) -> dict[int, str]:
    found = {i: ds.path(i) for i in range(len(ds)) if Path(ds.path(i)).name in BAD}
    assert len(found) == len(BAD)
    return found


def children() -> list[psutil.Process]:
    gc.collect()
    deadline = time.monotonic() + 5
    while True:
        alive = live_children()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def cap_worker_memory(worker_id: int) -> None:
    """worker_init_fn: a worker that tries to allocate gigabytes gets MemoryError, not the OOM
    killer (which on a shared machine may pick another process)."""
    data = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                data = int(line.split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (data + (768 << 20),) * 2)


def memory_cap(num_workers: int) -> dict:
    """FastLoader keyword arguments that cap each worker's private memory (see above)."""
    return {"worker_init_fn": cap_worker_memory} if num_workers > 0 else {}


# -- valid, if unusual ----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_png_png_named_jpg_and_cmyk_decode(root, num_workers):
    ds = ImageFolder(root, transform=EVAL)
    names = [Path(ds.path(i)).name for i in range(len(ds))]
    good = [i for i in range(len(ds)) if names[i] not in BAD]
    loader = FastLoader(ds, batch_sampler=[good[k:k + 5] for k in range(0, len(good), 5)],
                        num_workers=num_workers)
    images = torch.cat([x for x, _ in loader])
    rows = dict(zip(good, images))
    want = torch.from_numpy(EVAL.apply_array(unusual_image()).transpose(2, 0, 1).copy())
    assert torch.equal(rows[names.index("img_00003_lossless.png")], want)
    assert torch.equal(rows[names.index("img_00003_png_named.jpg")], want)
    if "img_00005_cmyk.jpg" not in names:
        pytest.skip("this Pillow cannot write CMYK JPEGs")
    cmyk = rows[names.index("img_00005_cmyk.jpg")]
    assert (cmyk.float() - want.float()).abs().mean() < 4  # JPEG at quality 95, via CMYK


# -- on_error="raise" -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_raise_names_the_file_and_the_sample_index(root, num_workers):
    ds = ImageFolder(root, transform=EVAL)
    first_bad, path = min(bad_indices(ds).items())
    loader = FastLoader(ds, batch_size=4, num_workers=num_workers)
    for _ in range(2):  # the loader stays usable: the next epoch raises the same error
        with pytest.raises(DecodeError) as info:
            for _ in loader:
                pass
        msg = str(info.value)
        assert path in msg and f"sample index {first_bad}" in msg, msg
        assert "on_error='skip'" in msg
        assert isinstance(info.value, ValueError)
    del loader, info
    assert children() == []


def test_raise_in_a_shuffled_epoch_names_the_bad_file_met_first(root):
    ds = ImageFolder(root, transform=RandomResizedCrop(48))
    bad = bad_indices(ds)
    # the order this generator gives (DataLoader draws the same numbers from it as FastLoader)
    indices = torch.utils.data.TensorDataset(torch.arange(len(ds)))
    order = torch.cat([b for b, in torch.utils.data.DataLoader(
        indices, batch_size=3, shuffle=True, generator=gen(5))]).tolist()
    first = next(i for i in order if i in bad)
    loader = FastLoader(ds, batch_size=3, shuffle=True, num_workers=2,
                        generator=gen(5))
    with pytest.raises(DecodeError) as info:
        list(loader)
    msg = str(info.value)
    assert f"(sample index {first})" in msg and bad[first] in msg, msg
    assert sum(path in msg for path in bad.values()) == 1


# -- on_error="skip" ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_bad_samples_out_counts_and_logs_each_file_once(root, num_workers, caplog):
    caplog.set_level(logging.WARNING, logger="gpufeed")
    ds = ImageFolder(root, transform=EVAL)
    bad = bad_indices(ds)
    good = [i for i in range(len(ds)) if i not in bad]
    batch = 4
    batches = [list(range(k, min(k + batch, len(ds)))) for k in range(0, len(ds), batch)]
    loader = FastLoader(ds, batch_size=batch, num_workers=num_workers, on_error="skip",
                        persistent_workers=num_workers > 0, **memory_cap(num_workers))
    for epoch in range(2):
        got = [(x.clone(), y.clone()) for x, y in loader]
        assert [len(y) for _, y in got] == [sum(i not in bad for i in b) for b in batches]
        assert min(len(y) for _, y in got) < batch  # some batches really are smaller
        images = torch.cat([x for x, _ in got])
        labels = torch.cat([y for _, y in got])
        assert labels.tolist() == [ds.targets[i] for i in good]
        for row, i in zip(images, good):
            assert torch.equal(row, ds[i][0])
        stats = loader.stats()
        assert stats["skipped"] == (epoch + 1) * len(bad)
        assert stats["images"] == (epoch + 1) * len(good)
    records = [r for r in caplog.records
               if r.name.startswith("gpufeed") and "skipped" in r.getMessage()]
    for i, path in bad.items():
        naming = [r for r in records if path in r.getMessage()]
        assert len(naming) == 1, f"{path}: logged {len(naming)} times over 2 epochs"
        assert f"sample index {i}" in naming[0].getMessage()
        assert naming[0].levelno == logging.WARNING
    assert len(records) == len(bad)
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_with_float_channels_last_and_cache_matches_skip_uint8(root, num_workers):
    ds = ImageFolder(root, transform=EVAL)
    bad = bad_indices(ds)
    n_good = len(ds) - len(bad)
    plain = [(x.clone(), y.clone()) for x, y in FastLoader(ds, batch_size=5, on_error="skip")]
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    loader = FastLoader(ds, batch_size=5, num_workers=num_workers, on_error="skip",
                        channels_last=True, normalize=(mean, std), cache_bytes="16MB",
                        persistent_workers=num_workers > 0, **memory_cap(num_workers))
    m = torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    for epoch in range(2):
        got = list(loader)
        assert len(got) == len(plain)
        for (x, y), (u8, uy) in zip(got, plain):
            assert x.is_contiguous(memory_format=torch.channels_last) and x.dtype == torch.float32
            assert torch.equal(y, uy)
            err = (x.double() - (u8.double() / 255 - m) / s).abs().max().item()
            assert err < 1e-5
        del got
    stats = loader.stats()
    assert stats["skipped"] == 2 * len(bad)  # bad files are not cached: they fail every epoch
    assert stats["cache_bytes"] == n_good * 3 * 64 * 64
    assert stats["cache_hits"] == n_good
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_transform_skips_the_same_files(root, num_workers):
    ds = ImageFolder(root, transform=RandomResizedCrop(48))
    bad = bad_indices(ds)
    kw = dict(batch_size=6, shuffle=True, on_error="skip", seed=3)  # 3 bad files: no all-bad batch
    want = [(x.clone(), y.clone()) for x, y in FastLoader(ds, generator=gen(1), **kw)]
    loader = FastLoader(ds, num_workers=num_workers, generator=gen(1),
                        **memory_cap(num_workers), **kw)
    got = list(loader)
    assert [len(y) for _, y in got] == [len(y) for _, y in want]
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    assert sum(len(y) for _, y in got) == len(ds) - len(bad)
    assert loader.stats()["skipped"] == len(bad)


# -- a batch with no good sample ------------------------------------------------------------------


def test_batch_of_only_bad_files_is_empty_without_workers(root):
    ds = ImageFolder(root, transform=EVAL)
    bad = sorted(bad_indices(ds))
    loader = FastLoader(ds, batch_sampler=[[0, 1], bad, [4, 5]], on_error="skip")
    got = list(loader)
    assert [tuple(x.shape) for x, _ in got] == [(2, 3, 64, 64), (0, 3, 64, 64), (2, 3, 64, 64)]
    assert got[1][1].dtype == torch.int64 and got[1][1].shape == (0,)
    assert loader.stats()["skipped"] == len(bad)


def test_batch_of_only_bad_files_is_empty_with_workers(root):
    """As without workers: the all-bad batch arrives empty. (The worker must not pickle the
    empty view of its slot inline: that copies the slot's whole arena chunk, gigabytes, and
    without the memory cap below the OOM killer ends the worker, again at every restart.)"""
    ds = ImageFolder(root, transform=EVAL)
    bad = sorted(bad_indices(ds))
    loader = FastLoader(ds, batch_sampler=[[0, 1], bad, [4, 5]], on_error="skip", num_workers=2,
                        worker_init_fn=cap_worker_memory, max_worker_restarts=0)
    got = list(loader)
    assert [tuple(x.shape) for x, _ in got] == [(2, 3, 64, 64), (0, 3, 64, 64), (2, 3, 64, 64)]
    assert got[1][1].dtype == torch.int64 and got[1][1].shape == (0,)
    assert loader.stats()["skipped"] == len(bad)
