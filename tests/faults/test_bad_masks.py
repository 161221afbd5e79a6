"""Segmentation masks that do not decode, or do not fit their image, through the loader, in the
main process and in workers: ``on_error="raise"`` gives a ``DecodeError`` (a ``ValueError``)
naming the mask, the sample index and the fix; ``on_error="skip"`` leaves the pair out of its
batch, counted and logged, as an image that does not decode."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from gpufeed import DecodeError, FastLoader
from gpufeed._synth_coco import palette_png
from tests.faults._datasets import segmentation_pairs
from tests.integration._detection import tuple_collate

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pairs(tmp_path):
    """Five pairs: sample 1's mask cut in half, sample 3's mask of another size."""
    ds, seg, reference = segmentation_pairs(tmp_path, 5, seed=7)
    whole = seg.mask_paths[1].read_bytes()
    seg.mask_paths[1].write_bytes(whole[: len(whole) // 2])
    seg.mask_paths[3].write_bytes(palette_png(np.zeros((5, 7), np.uint8)))
    return ds, seg, reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_cut_mask_raises_a_decode_error_naming_it_and_the_fix(pairs, num_workers):
    ds, seg, _ = pairs
    with pytest.raises(DecodeError) as info:
        list(FastLoader(ds, batch_size=2, num_workers=num_workers, collate_fn=tuple_collate))
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"the mask {seg.mask_paths[1]} of sample index 1" in msg and "on_error='skip'" in msg, msg


def test_a_mask_of_another_size_raises_a_decode_error_naming_both_sizes(pairs):
    ds, seg, _ = pairs
    with pytest.raises(DecodeError) as info:
        list(FastLoader(ds, batch_sampler=[[2, 3]], collate_fn=tuple_collate))
    msg = str(info.value)
    assert f"{seg.mask_paths[3]} of sample index 3 is 7x5" in msg and str(seg.image_paths[3]) in msg, msg


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_the_bad_pairs_out_counts_and_logs_them(pairs, num_workers, caplog):
    ds, seg, reference = pairs
    loader = FastLoader(ds, batch_size=2, num_workers=num_workers, collate_fn=tuple_collate, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        got = list(loader)
    kept = [0, 2, 4]
    assert [len(images) for images, _ in got] == [1, 1, 1]
    pairs_got = [(image, mask) for images, masks in got for image, mask in zip(images, masks)]
    for (image, mask), i in zip(pairs_got, kept):
        assert torch.equal(image, reference[i][0]) and torch.equal(mask, reference[i][1])
    assert loader.stats()["skipped"] == 2
    assert str(seg.mask_paths[1]) in caplog.text and str(seg.mask_paths[3]) in caplog.text
