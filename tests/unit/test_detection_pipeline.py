"""``DetectionPipeline``'s output stage without torchvision: the image's dtype, scale and
normalize as torchvision's ``ToDtype``/``Normalize`` compute them, masks' dtype, plain tensors,
an image the ops left float, the arena's allocator, the checks of the arguments, ``describe``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpufeed.image.detection import Boxes, DetectionPipeline, KeyPoints, Mask, Sample
from gpufeed.image.detection._sample import JointOp


def _sample(h: int = 6, w: int = 9) -> Sample:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    target = {"boxes": Boxes(np.array([[1.0, 2.0, 5.0, 4.0]]), "XYXY", (h, w)),
              "masks": Mask(data=(rng.random((2, h, w)) > 0.5).astype(np.uint8)),
              "points": KeyPoints(np.array([[1.25, 2.5]]), canvas=(h, w)),
              "labels": torch.tensor([3])}
    return Sample(img, target)


def _chw(sample: Sample) -> torch.Tensor:
    return torch.from_numpy(sample.image).permute(2, 0, 1)


def test_uint8_output_is_the_chw_image():
    s = _sample()
    image, target = DetectionPipeline(image_dtype=torch.uint8).output(s)
    assert image.dtype == torch.uint8 and torch.equal(image, _chw(s))
    assert target["boxes"].dtype == torch.float32
    assert torch.equal(target["boxes"], torch.tensor([[1.0, 2.0, 5.0, 4.0]]))
    assert target["masks"].dtype == torch.uint8 and target["masks"].shape == (2, 6, 9)
    assert torch.equal(target["points"], torch.tensor([[1.25, 2.5]]))
    assert torch.equal(target["labels"], torch.tensor([3]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_float_scaled_as_to_dtype(dtype):
    s = _sample()
    image, _ = DetectionPipeline(image_dtype=dtype).output(s)
    assert image.dtype == dtype
    assert torch.equal(image, _chw(s).to(dtype).mul_(1.0 / 255))  # torchvision's to_dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_level_scales_as_to_dtype(dtype):
    """The one-pass conversion (uint8 times the scale in the output's dtype) at all 256 levels."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = np.stack([levels, levels.T, levels[::-1]], axis=-1)
    image, _ = DetectionPipeline(image_dtype=dtype).output(Sample(img, {}))
    want = torch.from_numpy(img).permute(2, 0, 1).to(dtype).mul_(1.0 / 255)
    assert torch.equal(image, want)


def test_float_without_scale_keeps_0_255():
    s = _sample()
    image, _ = DetectionPipeline(image_dtype=torch.float32, scale=False).output(s)
    assert torch.equal(image, _chw(s).float())


def test_normalize_as_torchvision():
    s = _sample()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    image, _ = DetectionPipeline(normalize=(mean, std)).output(s)
    want = _chw(s).float().mul_(1.0 / 255)
    want = want.sub(torch.tensor(mean).view(-1, 1, 1)).div_(torch.tensor(std).view(-1, 1, 1))
    assert torch.equal(image, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("scale", [True, False])
def test_normalize_by_byte_table_is_the_ops_bit_for_bit(dtype, scale):
    # float32/float64 convert and normalize through a table of the 256 byte values per
    # channel; it must give torch's ToDtype + Normalize exactly, for every byte value
    s = _sample(40, 53)
    s.image.reshape(-1, 3)[:256] = np.arange(256, dtype=np.uint8)[:, None]
    given = []

    def alloc(shape, dt):
        given.append(torch.empty(shape, dtype=dt))
        return given[-1]

    for mean, std in (((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5,) * 3, (0.5,) * 3),
                      ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))):
        image, _ = DetectionPipeline(image_dtype=dtype, scale=scale, normalize=(mean, std)).output(s, alloc)
        want = _chw(s).to(dtype)
        if scale:
            want = want.mul_(1.0 / 255)
        want = want.sub_(torch.tensor(mean, dtype=dtype).view(-1, 1, 1)).div_(torch.tensor(std, dtype=dtype).view(-1, 1, 1))
        assert image.dtype == dtype and image is given[0] and torch.equal(image, want)
        given.clear()


def test_mask_dtype():
    s = _sample()
    _, target = DetectionPipeline(mask_dtype=torch.int64).output(s)
    assert target["masks"].dtype == torch.int64
    assert torch.equal(target["masks"], torch.from_numpy(s.target["masks"].data).long())


def test_single_plane_mask_target():
    mask = np.arange(54, dtype=np.uint8).reshape(6, 9)
    s = Sample(np.zeros((6, 9, 3), np.uint8), Mask(data=mask))
    _, target = DetectionPipeline(mask_dtype=torch.int64).output(s)
    assert target.shape == (6, 9) and torch.equal(target, torch.from_numpy(mask).long())


def test_pure_outputs_are_plain_tensors():
    _, target = DetectionPipeline(pure=True).output(_sample())
    assert all(type(v) is torch.Tensor for v in target.values())


def test_a_float_image_from_the_ops_is_not_scaled_again():
    s = _sample()
    s.image = s.image.astype(np.float32) / 255
    image, _ = DetectionPipeline(image_dtype=torch.float32).output(s)
    assert torch.equal(image, torch.from_numpy(s.image).permute(2, 0, 1))
    half, _ = DetectionPipeline(image_dtype=torch.float16).output(s)
    assert half.dtype == torch.float16
    kept, _ = DetectionPipeline(image_dtype=torch.uint8).output(s)  # no conversion: as it is
    assert kept.dtype == torch.float32
    before = s.image.copy()
    DetectionPipeline(normalize=((0.5,) * 3, (0.5,) * 3)).output(s)
    np.testing.assert_array_equal(s.image, before)  # the sample's array is not changed


def test_alloc_receives_the_image():
    s = _sample()
    given = []

    def alloc(shape, dtype):
        given.append(torch.empty(shape, dtype=dtype))
        return given[-1]

    image, _ = DetectionPipeline(image_dtype=torch.float32).output(s, alloc)
    assert image is given[0] and image.shape == (3, 6, 9)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="image_dtype"):
        DetectionPipeline(image_dtype=torch.int32)
    with pytest.raises(ValueError, match="normalize"):
        DetectionPipeline(image_dtype=torch.uint8, normalize=((0.5,) * 3, (0.5,) * 3))
    with pytest.raises(ValueError, match="non-zero"):
        DetectionPipeline(normalize=((0.5,) * 3, (0.0, 1.0, 1.0)))
    with pytest.raises(ValueError, match="mask_dtype"):
        DetectionPipeline(mask_dtype="int64")  # type: ignore[arg-type]


class _Shift(JointOp):
    name = "Shift"

    def draw(self, rng, sample):
        return 1

    def apply(self, sample, params):
        return Sample(np.roll(sample.image, params, axis=1), sample.target)

    def __repr__(self) -> str:
        return "Shift()"


def test_run_and_describe():
    s = _sample()
    pipeline = DetectionPipeline(ops=(_Shift(),), mask_dtype=torch.int64,
                                 normalize=((0.5,) * 3, (0.25,) * 3))
    out = pipeline.run(s, np.random.default_rng(0))
    np.testing.assert_array_equal(out.image, np.roll(s.image, 1, axis=1))
    assert pipeline.describe() == [
        "fast: Shift()",
        "output: image float32 on the 0-1 scale, normalized (mean=[0.5, 0.5, 0.5], "
        "std=[0.25, 0.25, 0.25]), masks int64, plain tensors"]
