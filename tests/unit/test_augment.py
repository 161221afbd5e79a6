"""gpufeed.image.augment: parameters from (seed, epoch, index) only, ops as functions of their draws,
on the fast path's rows in both layouts, and argument errors at construction."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from gpufeed import RandomResizedCrop, ResizeCenterCrop
from gpufeed.image import augment as A
from gpufeed.synth import encode, photo_like

ALL_OPS = (A.ColorJitter(0.4, 0.4, 0.4, 0.1), A.RandomGrayscale(0.3), A.GaussianBlur(5),
           A.RandomSolarize(100), A.RandomPosterize(3), A.RandomEqualize(), A.RandomAutocontrast(),
           A.RandomInvert(), A.RandomAdjustSharpness(1.5), A.RandomRotation(20, fill=(1, 2, 3)),
           A.RandomHorizontalFlip(0.3), A.RandomVerticalFlip(0.7), A.TrivialAugmentWide(),
           A.RandAugment(2, 9), A.AutoAugment(), A.TimmRandAugment.from_config("rand-m9-mstd0.5-inc1"),
           A.TimmAutoAugment.from_config("original-mstd0.5"), A.TimmAutoAugment("v0r"),
           A.TimmAutoAugment("3a"), A.TimmRandAugment.from_config("rand-m9-mstd0.5-t3a"),
           A.TimmRandAugment.from_config("rand-m9-mstd0.5-inc1-t3aw"),
           A.RandomAffine(20, (0.1, 0.2), (0.8, 1.2), 10, "bilinear", (1, 2, 3)),
           A.RandomApply((A.ColorJitter(0.4, 0.4), A.RandomInvert(0.5)), 0.8),
           A.RandomChoice((A.RandomSolarize(100, 1.0), A.RandomRotation(20)), (1, 3)),
           A.RandomOrder((A.RandomEqualize(0.5), A.GaussianBlur(3), A.RandomGrayscale(0.5))))


def test_row_rng_depends_on_its_inputs_only():
    a = A.row_rng(3, 1, 7).random(4)
    assert np.array_equal(a, A.row_rng(3, 1, 7).random(4))
    for other in (A.row_rng(3, 1, 8), A.row_rng(3, 2, 7), A.row_rng(4, 1, 7), A.row_rng(3, 1, 7, 1)):
        assert not np.array_equal(a, other.random(4))


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.name)
def test_each_op_is_a_function_of_its_draw(op):
    row = photo_like(64, 72, seed=1)
    outs = []
    for _ in range(2):
        params = op.draw(A.row_rng(0, 0, 5), 64, 72)
        out = op.apply(row.copy(), params)
        assert out.shape == row.shape and out.dtype == np.uint8
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    assert pickle.loads(pickle.dumps(op)) == op  # ops travel to spawned workers
    changed = [not np.array_equal(op(row.copy(), A.row_rng(0, e, 5)), row) for e in range(12)]
    assert any(changed), f"{op.name} never changed the row in 12 draws"


def test_row_ops_apply_in_order_from_one_stream():
    row = photo_like(48, 48, seed=2)
    ops = A.RowOps((A.RandomInvert(1.0), A.RandomSolarize(100, 1.0)))
    want = np.where(255 - row < 100, 255 - row, row).astype(np.uint8)
    assert np.array_equal(ops.apply(row.copy(), 0, 0, 0), want)
    assert ops.apply(row, 0, 0, 0) is row  # in place where the ops can


@pytest.mark.parametrize("bad,match", [
    (lambda: A.RandomInvert(1.5), "`p` must be a probability"),
    (lambda: A.GaussianBlur(4), "`kernel_size` must be an odd int"),
    (lambda: A.ColorJitter(hue=0.7), "`hue` must lie in"),
    (lambda: A.ColorJitter(brightness=(1.2, 0.8)), "min <= max"),
    (lambda: A.RandAugment(magnitude=31), "`magnitude` must be an int in"),
    (lambda: A.AutoAugment("cifar10"), "`policy` must be 'imagenet'"),
    (lambda: A.RandomRotation(10, fill=300), "levels must be numbers in"),
    (lambda: A.RandomErasing(value="noise"), "`value` must be"),
    (lambda: A.TimmRandomErasing(mode="gauss"), "`mode` must be"),
    (lambda: A.TimmRandAugment.from_config("augmix-m5"), "starts with 'rand'"),
    (lambda: A.TimmRandAugment(("Invert", "Equalize"), weights=(1,)), "one number >= 0 per op"),
    (lambda: A.TimmRandAugment.from_config("rand-m9-q3"), "cannot read timm RandAugment config"),
    (lambda: A.RandomAffine(10, translate=(0.1, 1.5)), "`translate` must be"),
    (lambda: A.RandomAffine(10, shear=(5, 1)), "`shear` must be None or 2 or 4 numbers"),
    (lambda: A.TimmRandAugment(("Invert", "Equalize"), 2, weights=(1, 0)), "at least num_layers"),
    (lambda: A.TimmAutoAugment("3aw"), "`policy` must be one of"),
    (lambda: A.TimmAutoAugment(((("Cutout", 1.0, 10),),)), "not a timm op gpufeed has"),
    (lambda: A.TimmAutoAugment.from_config("v0-m9"), "the only section is mstd"),
    (lambda: A.TimmAutoAugment.from_config("rand-m9"), "starts with a policy name"),
    (lambda: A.RandomApply((), 0.5), "at least one gpufeed RowOp"),
    (lambda: A.RandomApply((A.RandomErasing(),)), "must hold gpufeed RowOps"),
    (lambda: A.RandomChoice((A.RandomInvert(),), (1, 2)), "1 weights >= 0"),
    (lambda: RandomResizedCrop(64, ops=(A.RandomErasing(),)), "must hold gpufeed RowOps"),
    (lambda: RandomResizedCrop(64, ops=A.RandomInvert()), "must be a tuple"),
    (lambda: ResizeCenterCrop(64, 72, float_ops=(A.RandomInvert(),)), "FloatRowOps"),
])
def test_bad_arguments_fail_at_construction(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()


def test_timm_config_is_read():
    op = A.TimmRandAugment.from_config("rand-m7-n3-p0.8-mstd101-mmax12-inc1")
    assert (op.magnitude, op.num_layers, op.prob, op.magnitude_std, op.magnitude_max) == (
        7.0, 3, 0.8, float("inf"), 12)
    assert op.ops[4] == "PosterizeIncreasing"
    assert A.TimmRandAugment.from_config("rand-m9").ops[4] == "Posterize"


def test_transform_ops_in_both_layouts():
    data = encode(photo_like(150, 190, seed=3))
    t = RandomResizedCrop(64, ops=(A.RandAugment(2, 12), A.ColorJitter(0.3, 0.3, 0.3)))
    plain = RandomResizedCrop(64)
    assert not ResizeCenterCrop(64, 72, ops=(A.RandomInvert(1.0),)).deterministic
    assert not ResizeCenterCrop(64, 72, float_ops=(A.RandomErasing(),)).deterministic
    assert ResizeCenterCrop(64, 72).deterministic
    for index in range(6):
        hwc = np.empty((64, 64, 3), np.uint8)
        chw = np.empty((3, 64, 64), np.uint8)
        t.apply(data, index=index, epoch=1, seed=5, out=hwc)
        t.apply(data, index=index, epoch=1, seed=5, out=chw)
        assert np.array_equal(chw, hwc.transpose(2, 0, 1))
        base = np.empty((64, 64, 3), np.uint8)
        plain.apply(data, index=index, epoch=1, seed=5, out=base)
        ops = A.RowOps(t.ops)
        assert np.array_equal(ops.apply(base, 5, 1, index), hwc)  # the geometry, then the ops
