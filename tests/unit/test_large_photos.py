"""Large photos: the DCT-scaled decode takes the largest reduction (1/8, 1/4, 1/2) whose output
still covers the crop at the output size, for the eval and train transforms; a worker's decode
memory is the reduced image, not the full one; the output stays close to a full-size decode with
the same crop and resize; the large-photo generator and benchmark pipelines.

Which factor ``apply`` used is observed through ``tracemalloc``: the decoded image is the largest
allocation of the call (numpy arrays are traced), and consecutive factors differ 4x in bytes.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from gpufeed.decoders import read_header
from gpufeed.image import RandomResizedCrop, ResizeCenterCrop
from gpufeed.synth import encode, large_photo, make_image_folder

FACTORS = (8, 4, 2, 1)  # denominators, largest reduction first
# Mean absolute difference, 8-bit levels, from a full-size decode + the same crop and resize
# (dct_scaling=False). Measured on large_photo images at quality 95: eval 1.2-1.7, train
# 0.0-2.5 per image (mean 1.2-1.7); 0 where no reduction applies.
MAD_BOUND = 3.0


@pytest.fixture(scope="module")
def photos() -> dict[tuple[int, int], bytes]:
    sizes = [(3000, 4000), (4000, 3000), (1500, 2000), (768, 1024), (480, 640)]
    big = encode(large_photo(3000, 4000, seed=2), quality=95)
    out = {(3000, 4000): big}
    for h, w in sizes[1:]:
        out[(h, w)] = encode(large_photo(h, w, seed=h), quality=95)
    return out


def decoded_bytes(h: int, w: int, den: int) -> int:
    return math.ceil(h / den) * math.ceil(w / den) * 3


def factor_used(transform, data: bytes, index: int) -> tuple[int, int]:
    """(denominator of the factor apply decoded at, peak traced bytes of the call)."""
    header = read_header(data)
    out = np.empty((*transform.output_size, 3), np.uint8)
    tracemalloc.start()
    try:
        transform.apply(data, index=index, out=out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A decode cut at the crop's bottom row (decode_rows) also holds a patched copy of the file.
    for held in (peak, peak - len(data)):
        for den in FACTORS:
            size = decoded_bytes(header.height, header.width, den)
            if size <= held < 2 * size:
                return den, held
    raise AssertionError(f"peak {peak} bytes matches no decode size of {header.height}x{header.width}")


def largest_covering(h: int, w: int, box_h: float, box_w: float, oh: int, ow: int) -> int:
    """The spec, written independently: the largest reduction at which the crop, in decoded
    pixels, is still at least the output size on both axes."""
    for den in FACTORS:
        if box_h * math.ceil(h / den) / h >= oh and box_w * math.ceil(w / den) / w >= ow:
            return den
    return 1


EVAL_CASES = [((3000, 4000), 8), ((4000, 3000), 8), ((1500, 2000), 4), ((768, 1024), 2), ((480, 640), 1)]


@pytest.mark.parametrize("size,den", EVAL_CASES, ids=lambda v: str(v))
def test_eval_decodes_at_the_largest_covering_reduction(photos, size, den):
    t = ResizeCenterCrop(224, 256)
    used, peak = factor_used(t, photos[size], 0)
    _, _, bh, bw = t.source_box(*size)
    assert used == den == largest_covering(*size, bh, bw, 224, 224)
    if size == (3000, 4000):  # 0.56 MB decoded instead of 36 MB
        assert peak < 1_000_000


@pytest.mark.parametrize("size", [(3000, 4000), (1500, 2000)], ids=str)
def test_train_decodes_at_the_largest_covering_reduction(photos, size):
    t = RandomResizedCrop(224)
    seen = set()
    for index in range(8):
        p = t.params(0, 0, index, *size)
        want = largest_covering(*size, p.height, p.width, 224, 224)
        used, _ = factor_used(t, photos[size], index)
        assert used == want, (index, p)
        seen.add(used)
    assert len(seen) >= 2  # crops of different sizes took different reductions


@pytest.mark.parametrize("size,kind,num", [((3000, 4000), "eval", 1), ((1500, 2000), "eval", 1),
                                           ((3000, 4000), "train", 2), ((1500, 2000), "train", 4)],
                         ids=str)
def test_reduced_decode_stays_close_to_a_full_size_decode(photos, size, kind, num):
    cls = ResizeCenterCrop if kind == "eval" else RandomResizedCrop
    scaled, full = cls(224), cls(224, dct_scaling=False)
    for index in range(num):
        a = np.empty((224, 224, 3), np.uint8)
        b = np.empty_like(a)
        scaled.apply(photos[size], index=index, out=a)
        full.apply(photos[size], index=index, out=b)
        mad = np.abs(a.astype(np.int16) - b).mean()
        assert mad <= MAD_BOUND, (index, mad)


def test_large_photos_have_phone_jpeg_sizes(photos):
    assert 2_000_000 <= len(photos[(3000, 4000)]) <= 6_000_000
    header = read_header(photos[(4000, 3000)])
    assert (header.height, header.width) == (4000, 3000)


@pytest.mark.timeout(120)
def test_large_photo_pipelines_agree_with_fastloader(tmp_path):
    pytest.importorskip("PIL")
    from gpufeed.compare._large_photos import CV_REDUCED_NAME, PIL_DRAFT_NAME, large_photo_factories

    made = make_image_folder(tmp_path, num_classes=2, per_class=2, size=((900, 1000), (1200, 1300)),
                             seed=4, quality=95, large=True)
    assert made.num_images == 4
    for kind in ("eval", "train"):
        batches = {}
        for name, factory in large_photo_factories(tmp_path, kind, batch_size=4, num_workers=0).items():
            batches[name] = next(iter(factory()))
        fast = batches["FastLoader"][0].float()
        for name, (images, labels) in batches.items():
            assert images.shape == (4, 3, 224, 224) and images.dtype.is_floating_point is False
            assert labels.tolist() == batches["FastLoader"][1].tolist()
        for name in (PIL_DRAFT_NAME, CV_REDUCED_NAME):
            mad = (batches[name][0].float() - fast).abs().mean().item()
            assert mad <= MAD_BOUND + 1.0, (kind, name, mad)  # PIL: its own resampling
