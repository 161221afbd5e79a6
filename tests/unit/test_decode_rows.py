"""decode_rows: the top rows of a sequential JPEG equal a full decode's, byte for byte, for every
chroma layout; what cannot take the path is refused by row_decodable; damage in the rows decoded
is a DecodeError."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from gpufeed.decoders import (
    ROW_MARGIN,
    ImageHeader,
    _backends,
    backends,
    decode,
    decode_rows,
    read_header,
    row_decodable,
)
from gpufeed.decoders._header import jpeg_segments
from gpufeed.errors import DecodeError
from gpufeed.synth import encode, photo_like

requires_turbojpeg = pytest.mark.skipif(
    not backends()["turbojpeg"]["available"],
    reason=f"libturbojpeg not loadable: {backends()['turbojpeg']['reason']}")
pytestmark = requires_turbojpeg


def _cv2_jpeg(img: np.ndarray, sampling: int, restart: int = 0) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, 88, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling]
    if restart:
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    ok, enc = cv2.imencode(".jpg", np.ascontiguousarray(img[..., ::-1]), params)
    assert ok
    return enc.tobytes()


def _variants() -> dict[str, bytes]:
    img = photo_like(117, 90, seed=5, noise=3)  # neither side a multiple of 8 or 16
    return {
        "420": encode(img, quality=90),
        "444": encode(img, quality=90, subsampling="444"),
        "422": encode(img, quality=85, subsampling="422"),
        "gray": encode(img[..., 1], quality=90),
        "440+restarts": _cv2_jpeg(img, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440, restart=3),
        "420+restarts": _cv2_jpeg(img, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, restart=1),
    }


VARIANTS = _variants()


def _rows(data: bytes, rows: int) -> tuple[np.ndarray, int]:
    header = read_header(data)
    out = np.zeros((header.height, header.width, 3), np.uint8)
    return out, decode_rows(data, rows, header=header, out=out)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_row_count_gives_the_full_decodes_rows(name):
    data = VARIANTS[name]
    header = read_header(data)
    assert row_decodable(data, header)
    full = decode(data)
    for rows in range(0, header.height + 2):
        out, valid = _rows(data, rows)
        assert valid == (header.height if rows + ROW_MARGIN >= header.height else rows)
        assert np.array_equal(out[:valid], full[:valid]), (name, rows)


def test_the_rows_below_the_margin_are_not_decoded():
    data = VARIANTS["420"]
    out, valid = _rows(data, 20)
    assert valid == 20
    assert not out[20 + ROW_MARGIN:].any()  # the zeros it was given: nothing written there


def test_a_photo_sized_jpeg_decodes_its_top_rows_alike():
    img = photo_like(556, 562, seed=11, noise=4)
    data = encode(img, quality=92)
    full = decode(data)
    for rows in (1, 2, 15, 16, 17, 255, 300, 547):
        out, valid = _rows(data, rows)
        assert valid == rows and np.array_equal(out[:rows], full[:rows])


def test_what_cannot_be_decoded_by_rows_is_refused():
    img = photo_like(64, 48, seed=1)
    baseline = encode(img, quality=90)
    header = read_header(baseline)
    assert row_decodable(baseline, header)
    progressive = encode(img, quality=90, progressive=True)
    assert not row_decodable(progressive, read_header(progressive))
    truncated = baseline[:len(baseline) // 2]  # no EOI: must fail as a full decode does
    assert not row_decodable(truncated, header)
    png = cv2.imencode(".png", img)[1].tobytes()
    assert not row_decodable(png, read_header(png))
    rotated = ImageHeader(**{**header.__dict__, "orientation": 6})
    assert not row_decodable(baseline, rotated)
    marker, pos, _ = list(jpeg_segments(memoryview(baseline)))[-1]
    one_component_scan = bytearray(baseline)
    one_component_scan[pos + 4] = 1  # the first scan holds one of three components: one of several scans
    assert not row_decodable(bytes(one_component_scan), header)
    with pytest.raises(ValueError, match="sequential Huffman"):
        decode_rows(progressive, 8, header=read_header(progressive),
                    out=np.empty((64, 48, 3), np.uint8))


def test_without_libjpeg_turbo_nothing_is_decoded_by_rows():
    data = VARIANTS["420"]
    _backends.set_turbo_state(_backends.load_turbojpeg("/nonexistent/libturbojpeg.so.0"))
    try:
        with pytest.warns(Warning):
            assert not row_decodable(data, read_header(data))
    finally:
        _backends.set_turbo_state(None)


def test_out_must_be_the_images_size():
    data = VARIANTS["444"]
    with pytest.raises(ValueError, match="C-contiguous"):
        decode_rows(data, 4, header=read_header(data), out=np.empty((10, 10, 3), np.uint8))


def _scan_start(data: bytes) -> int:
    marker, pos, end = list(jpeg_segments(memoryview(data)))[-1]
    assert marker == 0xDA
    return end


def test_a_scan_cut_short_is_an_error_in_the_rows_it_reaches():
    img = photo_like(200, 160, seed=2, noise=4)
    data = encode(img, quality=90)
    cut = data[:_scan_start(data) + 300] + b"\xff\xd9"  # an EOI where the data stops
    header = read_header(cut)
    assert row_decodable(cut, header)
    with pytest.raises(DecodeError, match="(?i)premature end"):
        decode_rows(cut, 150, header=header, out=np.empty((200, 160, 3), np.uint8))
    with pytest.raises(DecodeError):
        decode(cut)


def test_the_segment_walk_skips_fill_bytes_and_stops_at_the_scan():
    data = VARIANTS["420"]
    padded = data[:2] + b"\xff\xff" + data[2:]  # fill bytes before the first marker
    markers = [m for m, _, _ in jpeg_segments(memoryview(padded))]
    assert markers[-1] == 0xDA and 0xC0 in markers
    assert read_header(padded) == read_header(data)
    out, valid = _rows(padded, 30)
    assert np.array_equal(out[:valid], decode(data)[:valid])


@pytest.mark.parametrize("subsampling", ["420", "422", "444"])
def test_dct_scaled_cuts_give_the_scaled_decodes_rows(subsampling):
    from gpufeed.decoders import scaled_size
    from gpufeed.decoders._backends import FACTORS

    img = photo_like(203, 171, seed=7, noise=4)
    data = encode(img, quality=88, subsampling=subsampling)
    header = read_header(data)
    for factor in FACTORS:
        h, w = scaled_size(header.height, header.width, factor)
        full = decode(data, min_height=h, min_width=w)
        assert full.shape[:2] == (h, w)
        for rows in range(0, h + 1, max(1, h // 15)):
            out = np.zeros((h, w, 3), np.uint8)
            valid = decode_rows(data, rows, header=header, out=out, factor=factor)
            assert valid == h or (valid == rows and rows + ROW_MARGIN < h)
            assert np.array_equal(out[:valid], full[:valid]), (factor, rows)
