"""Cheap image headers: size, format, EXIF orientation and colour layout without decoding pixels.

JPEG: one pass over the marker segments before the first scan (SOF for the size, the components
and their sampling factors, APP1/Exif for the orientation tag, APP0/JFIF and APP14/Adobe for the
colour space). This is pure Python on a handful of segments (a few microseconds) and gives the
EXIF orientation in the same pass, which ``TurboJPEG.decode_header`` does not. PNG: the IHDR
chunk. WebP and BMP: their fixed headers. Anything else (TIFF, PPM/PGM, ...): a full OpenCV
decode.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gpufeed.errors import DecodeError

Buffer = bytes | bytearray | memoryview | np.ndarray

# EXIF orientations 5-8 swap the axes (transpose/rotate by 90 degrees).
_TRANSPOSING = frozenset({5, 6, 7, 8})
# SOF markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC). Progressive: C2, C6, CA, CE.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


@dataclass(frozen=True)
class ImageHeader:
    """What an encoded image holds, read without decoding its pixels.

    ``height`` and ``width`` (pixels) are those of the image as :func:`decode` returns it, i.e.
    after the EXIF orientation is applied; ``encoded_height``/``encoded_width`` are as stored.
    ``fmt`` is "jpeg", "png" or "other". ``channels`` is the number of stored components (1 grey,
    3 colour, 4 CMYK/RGBA). ``cmyk`` is True for CMYK/YCCK JPEGs (which libjpeg-turbo's
    TurboJPEG API cannot turn into RGB). ``orientation`` is the EXIF tag value, 1-8 (1: as stored).
    JPEG only: ``sampling`` holds each component's (horizontal, vertical) sampling factors as
    stored, and ``colorspace`` the colour space libjpeg decodes it as ("gray", "ycbcr", "rgb",
    "cmyk", "ycck" or "" when unknown), by libjpeg's own rule (JFIF and Adobe markers, then the
    component ids). ``bit_depth``: bits per stored sample (8 for JPEG; a PNG's IHDR value; 16 or
    32 for a 16-bit or float TIFF, read by decoding), which :func:`decode` needs to turn a deep
    greyscale image into RGB as PIL's ``convert("RGB")`` does.
    """

    height: int
    width: int
    fmt: str
    channels: int = 3
    orientation: int = 1
    cmyk: bool = False
    progressive: bool = False
    sampling: tuple[tuple[int, int], ...] = ()
    colorspace: str = ""
    bit_depth: int = 8

    @property
    def transposed(self) -> bool:
        """True when the EXIF orientation swaps the stored axes (orientations 5-8)."""
        return self.orientation in _TRANSPOSING

    @property
    def encoded_height(self) -> int:
        """Height in pixels as stored in the file (before the EXIF orientation)."""
        return self.width if self.transposed else self.height

    @property
    def encoded_width(self) -> int:
        """Width in pixels as stored in the file (before the EXIF orientation)."""
        return self.height if self.transposed else self.width


def as_buffer(data: Buffer) -> memoryview:
    """Return a flat byte memoryview over ``data`` (bytes, bytearray, memoryview or uint8 array)."""
    try:
        # ndarray.data is the memoryview memoryview(ndarray) gives; numpy's stubs make ndarray a
        # Buffer only for Python >= 3.12, so the attribute keeps 3.10 type-checking exact.
        view = data.data if isinstance(data, np.ndarray) else memoryview(data)
    except TypeError:
        raise TypeError(
            f"encoded image must be bytes, bytearray, memoryview or a uint8 numpy array. "
            f"Found: {type(data).__name__}.") from None
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    return view


def sniff(buf: memoryview) -> str:
    """Return "jpeg", "png", "webp", "bmp" or "other" from the first bytes of ``buf``."""
    head = bytes(buf[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == _PNG_SIGNATURE:
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    return "other"


def read_header(data: Buffer) -> ImageHeader:
    """Read an encoded image's size, format and orientation without decoding pixels.

    Raises :class:`~gpufeed.errors.DecodeError` when the bytes are empty, not an image, or the
    header is cut short.
    """
    buf = as_buffer(data)
    if len(buf) == 0:
        raise DecodeError("empty input: 0 bytes (an empty file or a failed read?)")
    kind = sniff(buf)
    try:
        if kind == "jpeg":
            return _jpeg_header(buf)
        if kind == "png":
            return _png_header(buf)
        if kind == "webp":
            return _webp_header(buf)
        if kind == "bmp":
            return _bmp_header(buf)
    except (struct.error, IndexError):
        raise DecodeError(f"{kind} header is cut short ({len(buf)} bytes): "
                          f"truncated or corrupt file") from None
    return _header_by_decoding(buf)


def jpeg_segments(buf: memoryview) -> Iterator[tuple[int, int, int]]:
    """(marker, position, end) of each marker segment of a JPEG before its first scan: the
    marker byte (0xC0 for SOF0...), the position of its 0xFF and the position after it (fill
    bytes and standalone markers skipped); the walk ends at SOS (which it yields), EOI or the
    end of ``buf``. Raises DecodeError at a byte that is not a marker."""
    n = len(buf)
    pos = 2
    while pos + 4 <= n:
        if buf[pos] != 0xFF:
            raise DecodeError(f"jpeg: bad marker at byte {pos} (0x{buf[pos]:02x}): corrupt file")
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers
            pos += 2
            continue
        if marker == 0xD9:
            return
        (length,) = struct.unpack_from(">H", buf, pos + 2)
        yield marker, pos, pos + 2 + length
        if marker == 0xDA:  # start of scan: the header is over
            return
        pos += 2 + length


def _jpeg_header(buf: memoryview) -> ImageHeader:
    n = len(buf)
    size = None
    channels = 3
    orientation = 1
    progressive = False
    sampling: tuple[tuple[int, int], ...] = ()
    ids = b""
    jfif = False
    adobe_transform = None
    for marker, pos, end in jpeg_segments(buf):
        seg = pos + 4
        length = end - pos - 2
        if marker in _SOF:
            _, height, width, channels = struct.unpack_from(">BHHB", buf, seg)
            size = (height, width)
            progressive = marker in _PROGRESSIVE
            specs = bytes(buf[seg + 6:seg + 6 + 3 * channels])
            if len(specs) < 3 * channels:
                raise IndexError("SOF component specifications cut short")
            ids = specs[0::3]
            sampling = tuple([(hv >> 4, hv & 15) for hv in specs[1::3]])
        elif marker == 0xE0 and bytes(buf[seg:seg + 5]) == b"JFIF\x00" and length >= 16:
            jfif = True
        elif marker == 0xEE and bytes(buf[seg:seg + 5]) == b"Adobe" and length >= 14:
            adobe_transform = buf[seg + 11]
        elif marker == 0xE1 and bytes(buf[seg:seg + 6]) == b"Exif\x00\x00":
            orientation = _exif_orientation(buf[seg + 6:min(end, n)])
    if size is None:
        raise DecodeError(f"jpeg: no frame header (SOF) in the first {n} bytes: "
                          f"truncated or corrupt file")
    if size[0] == 0 or size[1] == 0:
        raise DecodeError(f"jpeg: frame header gives an empty image ({size[0]}x{size[1]})")
    height, width = size
    if orientation in _TRANSPOSING:
        height, width = width, height
    return ImageHeader(height=height, width=width, fmt="jpeg", channels=channels,
                       orientation=orientation, cmyk=channels == 4, progressive=progressive,
                       sampling=sampling,
                       colorspace=_jpeg_colorspace(channels, ids, jfif, adobe_transform))


def _jpeg_colorspace(channels: int, ids: bytes, jfif: bool,
                     adobe_transform: int | None) -> str:
    """The colour space libjpeg(-turbo) assumes for a JPEG (``default_decompress_parms``)."""
    if channels == 1:
        return "gray"
    if channels == 3:
        if jfif:
            return "ycbcr"
        if adobe_transform is not None:
            return "rgb" if adobe_transform == 0 else "ycbcr"
        return "rgb" if ids == b"RGB" else "ycbcr"  # component ids
    if channels == 4:
        return "ycck" if adobe_transform == 2 else "cmyk"
    return ""


def _exif_orientation(tiff: memoryview) -> int:
    """The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block; 1 when absent/bad."""
    try:
        order = bytes(tiff[:2])
        if order == b"II":
            e = "<"
        elif order == b"MM":
            e = ">"
        else:
            return 1
        magic, ifd = struct.unpack_from(e + "HI", tiff, 2)
        if magic != 42:
            return 1
        (count,) = struct.unpack_from(e + "H", tiff, ifd)
        for k in range(min(count, 256)):
            tag, typ, _, value = struct.unpack_from(e + "HHIH", tiff, ifd + 2 + 12 * k)
            if tag == 0x0112:
                return value if typ == 3 and 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1


def _png_header(buf: memoryview) -> ImageHeader:
    length, kind = struct.unpack_from(">I4s", buf, 8)
    if kind != b"IHDR" or length < 13:
        raise DecodeError("png: first chunk is not IHDR: corrupt file")
    width, height, bit_depth, color_type = struct.unpack_from(">IIBB", buf, 16)
    if width == 0 or height == 0:
        raise DecodeError(f"png: IHDR gives an empty image ({height}x{width})")
    return ImageHeader(height=height, width=width, fmt="png",
                       channels=_PNG_CHANNELS.get(color_type, 3), bit_depth=bit_depth)


def _webp_header(buf: memoryview) -> ImageHeader:
    chunk = bytes(buf[12:16])
    if chunk == b"VP8 ":
        width, height = struct.unpack_from("<HH", buf, 26)
        width, height = width & 0x3FFF, height & 0x3FFF
    elif chunk == b"VP8L":
        (bits,) = struct.unpack_from("<I", buf, 21)
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif chunk == b"VP8X":
        w0, w1, w2, h0, h1, h2 = struct.unpack_from("<6B", buf, 24)
        width = (w0 | w1 << 8 | w2 << 16) + 1
        height = (h0 | h1 << 8 | h2 << 16) + 1
    else:
        return _header_by_decoding(buf)
    if width == 0 or height == 0:
        raise DecodeError(f"webp: header gives an empty image ({height}x{width})")
    return ImageHeader(height=height, width=width, fmt="other")


def _bmp_header(buf: memoryview) -> ImageHeader:
    (dib_size,) = struct.unpack_from("<I", buf, 14)
    if dib_size == 12:
        width, height = struct.unpack_from("<HH", buf, 18)
    elif dib_size >= 40:
        width, height = struct.unpack_from("<ii", buf, 18)
    else:
        return _header_by_decoding(buf)
    if width <= 0 or height == 0:
        raise DecodeError(f"bmp: header gives an empty image ({abs(height)}x{width})")
    return ImageHeader(height=abs(height), width=width, fmt="other")


def _header_by_decoding(buf: memoryview) -> ImageHeader:
    import cv2

    img = cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        head = bytes(buf[:8])
        raise DecodeError(f"not a recognised image ({len(buf)} bytes starting with {head!r}); "
                          f"OpenCV could not decode it either")
    channels = 1 if img.ndim == 2 else img.shape[2]
    return ImageHeader(height=img.shape[0], width=img.shape[1], fmt="other", channels=channels,
                       bit_depth=8 * img.dtype.itemsize)
