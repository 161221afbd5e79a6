"""The image path's transforms decode a sequential JPEG only down to the last row their crops
take (``decode_rows``), at any DCT scale: the outputs equal a full decode's, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.decoders import backends, read_header
from gpufeed.image import MultiView, RandomResizedCrop, ResizeCenterCrop
from gpufeed.image import _transforms as transforms_module
from gpufeed.synth import encode, large_photo, photo_like

pytestmark = pytest.mark.skipif(not backends()["turbojpeg"]["available"],
                                reason="libturbojpeg not loadable: JPEGs decode whole with OpenCV")


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    out = [encode(photo_like(350 + 7 * i, 400 - 5 * i, seed=i, noise=4), quality=90,
                  subsampling=("420", "422", "444")[i % 3]) for i in range(6)]
    out.append(encode(large_photo(1200, 1600, seed=3), quality=92))  # DCT-scaled decodes
    return out


def _outputs(transform, data: bytes, index: int) -> list[np.ndarray]:
    if isinstance(transform, MultiView):
        return transform.outputs(data, index=index)
    out = np.empty((*transform.output_size, 3), np.uint8)
    transform.apply(data, index=index, out=out)
    return [out]


@pytest.mark.parametrize("transform", [
    RandomResizedCrop(224), RandomResizedCrop(96, scale=(0.05, 0.3)), ResizeCenterCrop(224, 256),
    MultiView([RandomResizedCrop(160)] * 2 + [RandomResizedCrop(64, scale=(0.05, 0.4))] * 3),
], ids=["rrc224", "rrc96-small", "eval", "multiview"])
def test_outputs_with_the_cut_decode_equal_the_full_decodes(jpegs, transform, monkeypatch):
    rows_asked: list[tuple[int, int]] = []
    real = transforms_module.decode_rows

    def recording(data, rows, **kw):
        rows_asked.append((rows, kw["out"].shape[0]))
        return real(data, rows, **kw)

    monkeypatch.setattr(transforms_module, "decode_rows", recording)
    cut = {(i, k): _outputs(transform, data, k) for i, data in enumerate(jpegs) for k in range(8)}
    monkeypatch.setattr(transforms_module, "row_decodable", lambda *a: False)
    for (i, k), got in cut.items():
        want = _outputs(transform, jpegs[i], k)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), (i, k)
    assert len(rows_asked) == len(cut)
    if not isinstance(transform, ResizeCenterCrop):
        assert any(rows < height for rows, height in rows_asked)  # some crops ended above the bottom


def test_an_image_with_an_exif_rotation_decodes_whole(monkeypatch):
    from gpufeed.synth import with_exif_orientation

    data = with_exif_orientation(encode(photo_like(120, 90, seed=1), quality=90), 6)
    assert read_header(data).orientation == 6
    monkeypatch.setattr(transforms_module, "decode_rows", lambda *a, **k: pytest.fail("cut a rotated image"))
    out = np.empty((64, 64, 3), np.uint8)
    RandomResizedCrop(64).apply(data, index=0, out=out)
