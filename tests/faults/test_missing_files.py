"""Files that go away (or become directories) after the dataset listed them, on the image path
and the per-sample (detection) path, in the main process and in workers.

``on_error="raise"``: the read's own error (a ``FileNotFoundError`` stays one, as under
``DataLoader``), with a note naming the sample index, its file, the process and the fix.
``on_error="skip"``: the sample is left out of its batch, counted and logged. An error that is
not the file's own (an I/O error) is raised under either setting, noted without the skip hint.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed._synth_coco import make_coco, make_segmentation
from gpufeed.errors import ReadError
from gpufeed.image._reads import skip_failed_read
from gpufeed.image.detection import DetectionPipeline
from gpufeed.sources import CocoDetection, SegmentationDataset
from tests.faults._datasets import segmentation_pairs
from tests.integration._detection import tuple_collate

pytestmark = pytest.mark.timeout(60)

HINT = "on_error='skip'"


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


@pytest.fixture
def folder(image_folder):
    """An ImageFolder of 2 x 5 JPEGs whose sample 3's file is removed after the scan."""
    root = image_folder(num_classes=2, per_class=5, size=((60, 80), (70, 90)), seed=4, private=True)
    ds = ImageFolder(root, transform=ResizeCenterCrop(32, 36))
    gone = ds.path(3)
    reference = [ds[i] for i in range(len(ds))]
    os.remove(gone)
    return ds, gone, reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_vanished_image_raises_its_error_with_the_sample_and_the_fix(folder, num_workers):
    ds, gone, _ = folder
    with pytest.raises(FileNotFoundError) as info:
        list(FastLoader(ds, batch_size=4, num_workers=num_workers))
    note = notes(info.value)
    assert gone in str(info.value) and "sample index 3" in note and gone in note, note
    assert HINT in note and ("main process" if num_workers == 0 else "worker") in note


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_a_vanished_image_out_counts_and_logs_it(folder, num_workers, caplog):
    ds, gone, reference = folder
    loader = FastLoader(ds, batch_size=4, num_workers=num_workers, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        got = list(loader)
    kept = [i for i in range(len(ds)) if i != 3]
    assert [len(y) for _, y in got] == [3, 4, 2]
    images, labels = torch.cat([x for x, _ in got]), torch.cat([y for _, y in got])
    assert labels.tolist() == [reference[i][1] for i in kept]
    assert all(torch.equal(row, reference[i][0]) for row, i in zip(images, kept))
    assert loader.stats()["skipped"] == 1 and gone in caplog.text and "sample index 3" in caplog.text


@pytest.fixture
def pairs(tmp_path):
    """Six image + mask pairs; sample 2's mask is made a directory after the dataset is built,
    sample 4's removed."""
    ds, seg, reference = segmentation_pairs(tmp_path, 6, seed=5)
    seg.mask_paths[2].unlink()
    seg.mask_paths[2].mkdir()
    seg.mask_paths[4].unlink()
    return ds, seg, reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_vanished_or_replaced_mask_raises_with_its_sample_under_raise(pairs, num_workers):
    ds, seg, _ = pairs
    with pytest.raises(IsADirectoryError) as info:
        list(FastLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=tuple_collate))
    note = notes(info.value)
    assert str(seg.mask_paths[2]) in str(info.value)
    assert "sample index 2" in note and str(seg.image_paths[2]) in note and HINT in note, note


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_samples_without_their_mask_out(pairs, num_workers, caplog):
    ds, seg, reference = pairs
    loader = FastLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=tuple_collate,
                        on_error="skip")
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        got = list(loader)
    kept = [0, 1, 3, 5]
    assert [len(images) for images, _ in got] == [2, 2]
    masks = [m for _, batch_masks in got for m in batch_masks]
    assert all(torch.equal(m, reference[i][1]) for m, i in zip(masks, kept))
    assert loader.stats()["skipped"] == 2
    assert str(seg.mask_paths[2]) in caplog.text and str(seg.mask_paths[4]) in caplog.text


def test_a_vanished_coco_image_is_skipped_with_its_id_kept_out(tmp_path):
    coco = make_coco(tmp_path / "coco", 6, seed=2)
    ds = CocoDetection(coco.root, coco.ann_file, transforms=DetectionPipeline(image_dtype=torch.uint8),
                       target_keys=["image_id", "boxes"])
    gone = ds.describe(1)
    shutil.move(gone, tmp_path / "moved.jpg")
    loader = FastLoader(ds, batch_size=4, num_workers=2, collate_fn=tuple_collate, on_error="skip")
    ids = [t["image_id"] for _, targets in loader for t in targets]
    assert ids == [ds.ids[i] for i in range(len(ds)) if i != 1]
    assert loader.stats()["skipped"] == 1


class FailingReads(SegmentationDataset):
    """Sample 1's read fails with an I/O error: not the file's own, so never skipped."""

    def read_item(self, index):
        if index == 1:
            raise OSError(errno.EIO, "Input/output error", self.describe(index))
        return super().read_item(index)


def test_an_io_error_is_raised_even_under_skip_without_the_skip_hint(tmp_path):
    seg = make_segmentation(tmp_path, 3, seed=6)
    ds = FailingReads(list(seg.image_paths), list(seg.mask_paths),
                      transforms=DetectionPipeline(image_dtype=torch.uint8))
    with pytest.raises(OSError) as info:
        list(FastLoader(ds, batch_size=3, collate_fn=tuple_collate, on_error="skip"))
    assert info.value.errno == errno.EIO
    note = notes(info.value)
    assert "sample index 1" in note and HINT not in note, note


def test_which_read_errors_are_skipped():
    for exc in (FileNotFoundError(errno.ENOENT, "gone"), IsADirectoryError(errno.EISDIR, "dir"),
                PermissionError(errno.EACCES, "denied"), ReadError("remote, for good")):
        assert skip_failed_read(exc, "skip", "f.jpg", 7) is True
        assert not notes(exc)  # skipped: logged by the loader, not noted
        assert skip_failed_read(exc, "raise", "f.jpg", 7) is False
        assert ("sample index 7" in notes(exc)) == (not isinstance(exc, ReadError))  # names itself
    other = TimeoutError(errno.ETIMEDOUT, "slow")
    assert skip_failed_read(other, "skip", "f.jpg", 7) is False
    assert "sample index 7 (f.jpg)" in notes(other) and HINT not in notes(other)
