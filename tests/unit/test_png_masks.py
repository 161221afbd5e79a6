"""``png_indices``: the fast mask-PNG decoder gives PIL's values (palette indices, greyscale
levels) for the PNGs it takes (8-bit palette/greyscale, None/Sub/Up rows) from PIL, OpenCV,
gpufeed's writer and hand-filtered rows; ``None`` for every other layout and for damaged data,
which ``SegmentationDataset`` then hands to PIL, whose error names the file. Every test runs
with both inflaters: zlib-ng's (the dependency) and the standard library's (the fallback)."""

from __future__ import annotations

import importlib
import io
import re
import struct
import zlib

import numpy as np
import pytest
import torch

cv2 = pytest.importorskip("cv2")
Image = pytest.importorskip("PIL.Image")

from gpufeed._synth_coco import make_segmentation, palette_png, voc_palette  # noqa: E402
from gpufeed.image.detection import DetectionPipeline  # noqa: E402
from gpufeed.sources import SegmentationDataset  # noqa: E402
from gpufeed.sources._png import png_indices  # noqa: E402

png_module = importlib.import_module("gpufeed.sources._png")  # ``_png`` is a helper's name here

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, params=["zlib-ng", "zlib"])
def inflate_with(request, monkeypatch):
    """Each test once per inflater (``inflater``: what ``png_indices`` calls)."""
    if request.param == "zlib":
        monkeypatch.setattr(png_module, "inflater", lambda: zlib)
    return request.param


def test_zlib_ng_inflates_when_installed(inflate_with):
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    assert png_module.inflater() is (zlib_ng if inflate_with == "zlib-ng" else zlib)

SIZES = [(1, 1), (1, 9), (7, 1), (2, 3), (13, 17), (31, 333), (200, 201), (557, 563)]


def _pil(data: bytes) -> np.ndarray:
    return np.array(Image.open(io.BytesIO(data)))


def _same_as_pil(data: bytes) -> np.ndarray:
    """The fast decode of ``data``, which it must take, checked against PIL."""
    got = png_indices(data)
    assert got is not None
    expect = _pil(data)
    assert got.dtype == np.uint8 and got.shape == expect.shape
    np.testing.assert_array_equal(got, expect)
    return got


def _row_filters(data: bytes) -> set[int]:
    """The filter types of the rows of an 8-bit one-channel PNG."""
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, tag = struct.unpack_from(">I4s", data, pos)
        if tag == b"IHDR":
            width = struct.unpack_from(">I", data, pos + 8)[0]
        elif tag == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return set(zlib.decompress(idat)[::width + 1])


def _same_as_pil_unless_average_or_paeth(data: bytes) -> None:
    got = png_indices(data)
    if _row_filters(data) & {3, 4}:
        assert got is None
    else:
        _same_as_pil(data)


def _mask_like(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Class indices in flat regions with 255-valued borders, as VOC masks."""
    rng = np.random.default_rng(seed)
    h, w = shape
    mask = np.zeros(shape, np.uint8)
    for _ in range(4):
        cls = int(rng.integers(1, 21))
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        axes = (int(rng.integers(1, w // 2 + 2)), int(rng.integers(1, h // 2 + 2)))
        cv2.ellipse(mask, center, axes, float(rng.uniform(0, 180)), 0, 360, 255, 2)
        cv2.ellipse(mask, center, axes, float(rng.uniform(0, 180)), 0, 360, cls, -1)
    return mask


def _noise(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def _png(pixels: np.ndarray, filters: list[int], *, colour: int = 3, depth: int = 8,
         interlace: int = 0, idat_parts: int = 1, extra: bytes = b"") -> bytes:
    """A PNG of ``pixels`` ((H, W) uint8) whose row ``i`` is filtered with ``filters[i]`` (0 None,
    1 Sub, 2 Up; 3 Average and 4 Paeth are written as their filter byte over unfiltered data:
    a valid file, decoded by PIL to other values), its IDAT split into ``idat_parts`` chunks and
    ``extra`` chunks before the image data."""
    h, w = pixels.shape
    px = pixels.astype(np.int32)
    rows = []
    for i, kind in enumerate(filters):
        if kind == 1:
            row = px[i] - np.concatenate([[0], px[i, :-1]])
        elif kind == 2:
            row = px[i] - (px[i - 1] if i else 0)
        else:
            row = px[i]
        rows.append(np.concatenate([[kind], row % 256]).astype(np.uint8))
    stream = zlib.compress(np.stack(rows).tobytes(), 6)
    cuts = np.linspace(0, len(stream), idat_parts + 1).astype(int)
    header = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace)
    plte = _chunk(b"PLTE", voc_palette()) if colour == 3 else b""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + extra + plte
            + b"".join(_chunk(b"IDAT", stream[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))
            + _chunk(b"IEND", b""))


def _pil_png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _pil_palette(pixels: np.ndarray) -> bytes:
    image = Image.frombytes("P", pixels.shape[::-1], pixels.tobytes())
    image.putpalette(voc_palette())
    return _pil_png(image)


@pytest.mark.parametrize("shape", SIZES)
def test_palette_pngs_written_by_pil_and_gpufeed(shape):
    for seed, pixels in enumerate([_mask_like(shape, 1), _noise(shape, 2)]):
        for data in (_pil_palette(pixels), palette_png(pixels)):
            np.testing.assert_array_equal(_same_as_pil(data), pixels, err_msg=f"{seed}")


@pytest.mark.parametrize("shape", SIZES)
def test_greyscale_pngs_written_by_pil(shape):
    # PIL filters greyscale rows adaptively (Sub, Up, Paeth): files with Paeth rows go to PIL.
    smooth = np.tile(np.arange(shape[1], dtype=np.uint8), (shape[0], 1))
    for pixels in (_mask_like(shape, 3), _noise(shape, 4), smooth):
        _same_as_pil_unless_average_or_paeth(_pil_png(Image.fromarray(pixels)))
    np.testing.assert_array_equal(_same_as_pil(_pil_png(Image.fromarray(smooth))), smooth)


@pytest.mark.parametrize("shape", SIZES)
def test_greyscale_masks_written_by_opencv(shape):
    # OpenCV's default (cv2.imwrite(path, mask)) filters every row with Sub; with an explicit
    # IMWRITE_PNG_COMPRESSION libpng picks filters per row, Paeth among them (left to PIL).
    mask = _mask_like(shape, 5)
    data = cv2.imencode(".png", mask)[1].tobytes()
    assert _row_filters(data) <= {0, 1}  # None for one-pixel rows
    np.testing.assert_array_equal(_same_as_pil(data), mask)
    for level in (1, 9):
        ok, buf = cv2.imencode(".png", mask, [cv2.IMWRITE_PNG_COMPRESSION, level])
        assert ok
        _same_as_pil_unless_average_or_paeth(buf.tobytes())
    _same_as_pil_unless_average_or_paeth(cv2.imencode(".png", _noise(shape, 6))[1].tobytes())


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("colour", [0, 3])
def test_rows_filtered_with_none_sub_and_up(shape, colour):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    h = shape[0]
    patterns = [[1] * h, [2] * h, [0] + [2] * (h - 1), [1] + [2] * (h - 1),
                list(rng.integers(0, 3, h)), [int(i % 3 == 2) * 2 for i in range(h)]]
    for pixels in (_mask_like(shape, 7), _noise(shape, 8)):
        for filters in patterns:
            data = _png(pixels, filters, colour=colour, idat_parts=3)
            np.testing.assert_array_equal(_same_as_pil(data), pixels, err_msg=f"{filters}")


def test_ancillary_chunks_and_chunks_after_the_image_data():
    pixels = _mask_like((40, 50), 9)
    text = _chunk(b"tEXt", b"Comment\x00mask")
    data = _png(pixels, [1] * 40, extra=text + _chunk(b"gAMA", struct.pack(">I", 45455)))
    np.testing.assert_array_equal(_same_as_pil(data), pixels)
    with_tail = data[:-12] + text + data[-12:]
    np.testing.assert_array_equal(_same_as_pil(with_tail), pixels)


@pytest.mark.parametrize("kind", [3, 4])
def test_average_and_paeth_rows_are_left_to_pil(kind):
    pixels = _mask_like((20, 30), 10)
    data = _png(pixels, [0] * 10 + [kind] + [1] * 9)
    assert png_indices(data) is None
    assert _pil(data).shape == (20, 30)


def test_other_layouts_are_left_to_pil():
    pixels = _mask_like((20, 30), 11)
    rgb = np.stack([pixels] * 3, axis=-1)
    four_bit = io.BytesIO()
    Image.frombytes("P", (30, 20), (pixels % 16).tobytes()).save(four_bit, "PNG", bits=4)
    cases = {
        "16-bit": _pil_png(Image.fromarray(pixels.astype(np.uint16) * 257)),
        "4-bit": four_bit.getvalue(),
        "1-bit": _pil_png(Image.fromarray(pixels > 5)),
        "rgb": _pil_png(Image.fromarray(rgb)),
        "rgba": _pil_png(Image.fromarray(np.concatenate([rgb, rgb[..., :1]], -1))),
        "grey+alpha": _pil_png(Image.fromarray(pixels).convert("LA")),
        "interlaced": _png(pixels, [0] * 20, interlace=1),
        "unknown filter": _png(pixels, [0] * 19 + [5]),
        "jpeg": cv2.imencode(".jpg", pixels)[1].tobytes(),
        "empty": b"",
    }
    for name, data in cases.items():
        assert png_indices(data) is None, name
    assert Image.open(io.BytesIO(cases["4-bit"])).info.get("bits", 4) == 4
    assert _pil(cases["16-bit"]).dtype != np.uint8


def test_damaged_pngs_are_left_to_pil():
    pixels = _mask_like((30, 40), 12)
    data = _png(pixels, [1] * 30, idat_parts=2)
    image_end = data.rindex(b"IEND") - 4
    for cut in range(0, len(data)):
        got = png_indices(data[:cut])
        if cut < image_end:
            assert got is None, cut
        elif got is not None:  # only IEND is missing: PIL reads such a file too
            np.testing.assert_array_equal(got, pixels)
    bad_header = bytearray(data)
    bad_header[20] ^= 1  # inside IHDR: its CRC no longer matches (PIL raises)
    assert png_indices(bytes(bad_header)) is None
    with pytest.raises(OSError):
        _pil(bytes(bad_header))
    bad_stream = data.replace(b"IDAT", b"IDAT\x00\x00\x00", 1)  # breaks the zlib stream
    assert png_indices(bad_stream) is None
    too_long = bytearray(data)
    too_long[8:12] = struct.pack(">I", 1 << 30)  # IHDR's length runs past the end
    assert png_indices(bytes(too_long)) is None


def test_segmentation_dataset_decodes_fast_and_names_a_damaged_mask(tmp_path):
    seg = make_segmentation(tmp_path / "voc", 3, seed=13)
    ds = SegmentationDataset(seg.images, seg.masks, DetectionPipeline(image_dtype=torch.uint8))
    for i, path in enumerate(seg.mask_paths):
        assert png_indices(path.read_bytes()) is not None
        _, mask = ds[i]
        assert torch.equal(mask[0], torch.from_numpy(_pil(path.read_bytes())))
    # A greyscale mask OpenCV wrote, and one PIL must decode (Paeth rows), give PIL's values.
    values = _pil(seg.mask_paths[0].read_bytes())
    seg.mask_paths[0].write_bytes(cv2.imencode(".png", values)[1].tobytes())
    seg.mask_paths[1].write_bytes(_png(_pil(seg.mask_paths[1].read_bytes()),
                                       [4] * len(_pil(seg.mask_paths[1].read_bytes()))))
    for i in (0, 1):
        _, mask = ds[i]
        assert torch.equal(mask[0], torch.from_numpy(_pil(seg.mask_paths[i].read_bytes())))
    whole = seg.mask_paths[2].read_bytes()
    seg.mask_paths[2].write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ValueError, match=re.escape(f"cannot decode the mask {seg.mask_paths[2]} of sample index 2")):
        ds[2]
    data, record = ds.read_item(2)
    with pytest.raises(ValueError, match=seg.mask_paths[2].name):
        ds.target_of(2, record, (1, 1))
