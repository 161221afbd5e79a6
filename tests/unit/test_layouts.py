"""Every output layout and dtype gives the numbers of the NCHW float32 batch.

The batch conversion (``gpufeed.image._normalize.convert_``) computes in float32 and rounds once,
so float16/bfloat16 output is *exactly* the NCHW float32 output cast, channels_last output is
exactly it transposed, and uint8 rows are the same bytes in both layouts. Checked on the
conversion alone (sizes that cross its chunking) and through FastLoader (num_workers=0: the
worker's code in this process) on generated JPEGs.
"""

from __future__ import annotations

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.image._normalize import _CHUNK_BYTES, affine, convert_, work_dtype

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DTYPES = [torch.uint8, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = [False, True]


def reference(images: torch.Tensor, normalize) -> torch.Tensor:
    """NCHW float32 by the formula, one whole-batch pass per operation (the old conversion)."""
    x = images.contiguous().float()
    if normalize is None:
        return x.mul_(1.0 / 255.0)
    scale, shift = affine(normalize, torch.float32)
    return x.mul_(scale).add_(shift)


def converted(images: torch.Tensor, dtype: torch.dtype, channels_last: bool, normalize) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    src = images.contiguous(memory_format=fmt)
    out = torch.empty(images.shape, dtype=dtype).contiguous(memory_format=fmt)
    constants = None if normalize is None else affine(normalize, work_dtype(dtype))
    return convert_(out, src, constants)


# (n, H, W): one image per chunk (224), several images per chunk, a chunk boundary mid-batch
SHAPES = [(3, 224, 224), (37, 20, 30), (2 * (_CHUNK_BYTES // (3 * 20 * 30 * 4)) + 5, 20, 30)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("normalize", [None, (MEAN, STD)], ids=["x/255", "normalize"])
@pytest.mark.parametrize("channels_last", LAYOUTS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_conversion_is_nchw_float32_cast_and_transposed(shape, normalize, channels_last, dtype):
    n, h, w = shape
    g = torch.Generator().manual_seed(n)
    images = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)
    images[0].view(-1)[:256] = torch.arange(256, dtype=torch.uint8)  # every value
    got = converted(images, dtype, channels_last, normalize)
    assert got.dtype == dtype and got.shape == images.shape
    if channels_last:
        assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    else:
        assert got.is_contiguous()
    if dtype == torch.float64:
        mean = torch.tensor(MEAN if normalize else (0.0,) * 3, dtype=torch.float64).view(1, 3, 1, 1)
        std = torch.tensor(STD if normalize else (1.0,) * 3, dtype=torch.float64).view(1, 3, 1, 1)
        torch.testing.assert_close(got, (images.double() / 255 - mean) / std, rtol=1e-12, atol=1e-12)
    else:
        assert torch.equal(got, reference(images, normalize).to(dtype))


def test_conversion_of_other_strides_gives_the_same_numbers():
    images = torch.randint(0, 256, (4, 3, 16, 18), dtype=torch.uint8)
    sliced = torch.randint(0, 256, (4, 3, 16, 36), dtype=torch.uint8)[..., ::2]
    sliced.copy_(images)
    out = torch.empty(images.shape, dtype=torch.float16)
    constants = affine((MEAN, STD), torch.float32)
    assert torch.equal(convert_(out, sliced, constants), reference(images, (MEAN, STD)).half())


def test_conversion_refuses_a_mismatched_output():
    images = torch.zeros((2, 3, 4, 4), dtype=torch.uint8)
    with pytest.raises(ValueError, match="shape"):
        convert_(torch.empty((2, 3, 4, 5)), images, None)
    with pytest.raises(ValueError, match="uint8"):
        convert_(torch.empty((2, 3, 4, 4)), images.float(), None)


# -- through the loader -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(image_folder):
    return image_folder(num_classes=2, per_class=5, size=((120, 160), (130, 170)), seed=3)


def epoch(root, **kwargs) -> torch.Tensor:
    loader = FastLoader(ImageFolder(root, transform=ResizeCenterCrop(56, 64)), batch_size=4,
                        num_workers=0, **kwargs)
    batches = []
    for x, _ in loader:
        if kwargs.get("channels_last"):
            assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        else:
            assert x.is_contiguous()
        batches.append(x.clone())
    return torch.cat(batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("channels_last", LAYOUTS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_layout_and_dtype_matches_nchw_float32(root, dtype, channels_last):
    normalize = None if dtype == torch.uint8 else (MEAN, STD)
    want_u8 = epoch(root)
    got = epoch(root, dtype=dtype, channels_last=channels_last, normalize=normalize)
    assert got.dtype == dtype and got.shape == want_u8.shape
    if dtype == torch.uint8:
        assert torch.equal(got, want_u8)
        return
    want = epoch(root, dtype=torch.float32, normalize=normalize)
    assert torch.equal(want, reference(want_u8, normalize))
    assert torch.equal(got, want.to(dtype))
