"""decode_rows(): the top rows of a sequential JPEG, without entropy-decoding the rest.

A crop needs the source only down to its bottom row, but libjpeg-turbo 2.1's TurboJPEG API (the
one Debian ships) has no partial decode, and the entropy decoding of the rows below the crop is
most of a JPEG's cost (0.94 of 1.35 ms on a 560 x 560 photo stays at 1/8 DCT scale). A
sequential JPEG codes its MCUs in raster order, so the first rows of the image are the first
rows of the scan: declaring a smaller height in the frame header (SOF) makes libjpeg decode only
the MCU rows that cover it and then skip to the end marker, warning "extraneous bytes before
marker" (benign under :func:`decode`'s rules). The rows it gives are the full decode's, byte
for byte, except the last one or two of a vertically subsampled image, whose chroma upsampling
takes the row below: :data:`ROW_MARGIN` extra rows keep every requested row exact (tested for
4:4:4, 4:2:2, 4:2:0, 4:4:0 and grey, with restart intervals, against full decodes).

Only baseline and extended sequential Huffman JPEGs (SOF0, SOF1) with all their components in
one scan, whose data ends with the EOI marker, take this path: progressive, arithmetic-coded and
multi-scan files, and files without an EOI at their end (a truncated file must fail as a full
decode fails), are decoded whole.
"""

from __future__ import annotations

import struct

import numpy as np

from gpufeed.decoders import _backends
from gpufeed.decoders._decode import decode_turbojpeg_into, jpeg_decoder, scaled_size
from gpufeed.decoders._header import _SOF, Buffer, ImageHeader, as_buffer, jpeg_segments
from gpufeed.errors import DecodeError

__all__ = ["ROW_MARGIN", "decode_rows", "row_decodable"]

#: Rows decoded below the last one asked for: vertical chroma upsampling reads one row further
#: (one is enough in the tests; this leaves room and costs about 1% of a 560-row decode).
ROW_MARGIN = 8

_SEQUENTIAL_HUFFMAN = (0xC0, 0xC1)


def _height_offset(buf: memoryview) -> int | None:
    """Byte offset of the frame header's height field when the JPEG is sequential Huffman
    (SOF0/SOF1) with every component in its first scan (so its only scan), else None."""
    offset = components = None
    for marker, pos, _ in jpeg_segments(buf):
        if marker in _SOF:
            if marker not in _SEQUENTIAL_HUFFMAN:
                return None
            offset, components = pos + 5, buf[pos + 9]
        elif marker == 0xDA:  # the first scan: interleaved, or one of several scans
            return offset if offset is not None and buf[pos + 4] == components else None
    return None


def row_decodable(data: Buffer, header: ImageHeader) -> bool:
    """Whether :func:`decode_rows` can decode ``data`` partially: a sequential Huffman JPEG with
    one scan, in stored orientation, not CMYK, ending with its EOI marker, with libjpeg-turbo
    loaded."""
    if header.fmt != "jpeg" or header.progressive or header.cmyk or header.orientation != 1:
        return False
    buf = as_buffer(data)
    if len(buf) < 4 or buf[-2] != 0xFF or buf[-1] != 0xD9:
        return False
    if jpeg_decoder(header, None) != "turbojpeg":
        return False
    try:
        return _height_offset(buf) is not None
    except (DecodeError, struct.error):
        return False


def decode_rows(data: Buffer, rows: int, *, header: ImageHeader, out: np.ndarray,
                factor: tuple[int, int] = (1, 1)) -> int:
    """Decode the image's rows [0, ``rows``) into ``out``, an (H, W, 3) uint8 C-contiguous array
    of the image's stored size (the :data:`ROW_MARGIN` rows below them are written too, not
    exactly); returns how many top rows of ``out`` now hold the image: ``rows``, or H when the
    margin reaches the bottom (then the whole image is decoded). ``data`` must pass
    :func:`row_decodable`. The rows are :func:`gpufeed.decoders.decode`'s, byte for byte.
    ``factor``: a DCT scaling factor from ``FACTORS`` (then H, W and ``rows`` are the scaled
    image's, as ``decode(min_height=..., min_width=...)`` would give it at that factor).
    Raises DecodeError for corrupt data in the rows decoded (as :func:`decode` would)."""
    height, width = scaled_size(header.height, header.width, factor)
    if out.shape != (height, width, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"`out` must be a C-contiguous ({height}, {width}, 3) uint8 array. "
                         f"Found: {out.shape} {out.dtype}.")
    num, den = factor
    keep = min(height, max(int(rows), 0) + ROW_MARGIN)
    # the source height whose scaled height first reaches `keep` rows
    source_rows = min(header.height, -(-keep * den // num))
    buf = as_buffer(data)
    if source_rows < header.height:
        offset = _height_offset(buf)
        if offset is None:
            raise ValueError(f"decode_rows needs a sequential Huffman JPEG (row_decodable). "
                             f"Found: {header}.")
        patched = bytearray(buf)
        struct.pack_into(">H", patched, offset, source_rows)
        buf = memoryview(patched)
    if _backends.turbo_state().decoder is None:
        raise ValueError("decode_rows needs libjpeg-turbo (row_decodable).")
    decoded = scaled_size(source_rows, header.width, factor)[0]
    decode_turbojpeg_into(buf, out[:decoded], factor)
    return height if decoded == height else max(int(rows), 0)
