"""One normalize for both paths: the CPU fill's ``_to_float`` and the GPU transform compute the
same numbers (checked on CPU tensors), from one validation and one (scale, shift)."""

from __future__ import annotations

import pytest
import torch

from gpufeed.cuda._transform import GpuTransform
from gpufeed.image import ResizeCenterCrop
from gpufeed.image._fill import ImagePlan, _to_float
from gpufeed.image._normalize import check_image_output, scale_shift

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
H, W = 12, 10  # 3 x H x W >= 256: one image holds every uint8 value


def uint8_batch(n: int, channels_last: bool) -> torch.Tensor:
    """Every value 0-255 in every channel, as the fill leaves the rows: NCHW shape, NHWC memory
    with ``channels_last``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, H, W), dtype=torch.uint8, generator=g)
    x[0].view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def cpu_path(images: torch.Tensor, dtype: torch.dtype, normalize, channels_last: bool) -> torch.Tensor:
    plan = ImagePlan(transform=ResizeCenterCrop(size=(H, W), resize=H), channels_last=channels_last,
                     normalize=normalize, dtype=dtype)
    buf = torch.zeros(len(images) * 3 * H * W * dtype.itemsize + 64, dtype=torch.uint8)
    return _to_float(plan, images, buf, 64)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("normalize", [None, (MEAN, STD)], ids=["x/255", "normalize"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_cpu_and_gpu_paths_give_the_same_numbers(dtype, normalize, channels_last):
    images = uint8_batch(4, channels_last)
    cpu = cpu_path(images, dtype, normalize, channels_last)
    gpu = GpuTransform(dtype, normalize, channels_last).apply(images)
    assert cpu.dtype == gpu.dtype == dtype and cpu.shape == gpu.shape == images.shape
    assert torch.equal(cpu, gpu)
    mean = torch.tensor(MEAN if normalize else (0.0,) * 3, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD if normalize else (1.0,) * 3, dtype=torch.float64).view(1, 3, 1, 1)
    want = (images.double() / 255 - mean) / std
    assert (cpu.double() - want).abs().max().item() <= 8 * torch.finfo(dtype).eps * want.abs().max().item() + 1e-12


def test_scale_and_shift_are_the_torchvision_formula():
    scale, shift = scale_shift((MEAN, STD))
    for x in (0.0, 1.0, 127.0, 255.0):
        assert [x * a + b for a, b in zip(scale, shift)] == pytest.approx(
            [(x / 255 - m) / s for m, s in zip(MEAN, STD)], rel=1e-12, abs=1e-12)


def test_gpu_constants_are_built_once_per_device():
    transform = GpuTransform(torch.float32, (MEAN, STD))
    images = uint8_batch(2, False)
    first = transform.apply(images)
    built = transform.constants(images.device)
    for _ in range(5):
        assert torch.equal(transform.apply(images), first)
    again = transform.constants(torch.device("cpu"))
    assert built is not None and again is not None
    assert all(a is b for a, b in zip(built, again))  # the same tensors, not rebuilt per batch
    assert GpuTransform(torch.float32).constants(images.device) is None


BAD = [
    (torch.int32, None, "`dtype`"),
    (torch.float32, ((0.5, 0.5), (0.5, 0.5)), "`normalize`"),
    (torch.float32, (MEAN, (0.2, 0.0, 0.2)), "`normalize`"),
    (torch.float32, (MEAN,), "`normalize`"),
]


@pytest.mark.parametrize("dtype,normalize,match", BAD)
def test_bad_values_are_refused_by_both_paths_with_one_message(dtype, normalize, match):
    with pytest.raises(ValueError, match=match) as direct:
        check_image_output(dtype, normalize)
    with pytest.raises(ValueError) as plan:
        ImagePlan(transform=ResizeCenterCrop(size=(H, W), resize=H), normalize=normalize, dtype=dtype)
    with pytest.raises(ValueError) as gpu:
        GpuTransform(dtype, normalize)
    assert str(direct.value) == str(plan.value) == str(gpu.value)
    assert "Found:" in str(direct.value)


def test_normalize_on_the_0_255_scale_warns_once():
    import warnings

    from gpufeed.errors import GpufeedWarning

    imagenet_255 = ((123.7, 116.3, 103.5), (58.4, 57.1, 57.4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per place and message
        for _ in range(3):
            check_image_output(torch.float32, imagenet_255)
    assert len(caught) == 1 and issubclass(caught[0].category, GpufeedWarning)
    assert "0-255" in str(caught[0].message) and "123.7" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_image_output(torch.float32, (MEAN, STD))  # the 0-1 scale: no warning
