"""Image decoding behind one contract: bytes in, (H, W, 3) uint8 RGB out.

libjpeg-turbo (through PyTurboJPEG) decodes JPEGs when it loads, OpenCV otherwise; OpenCV
decodes PNG, WebP, BMP, TIFF and CMYK JPEGs. Nothing is loaded at import: backends load on first
use, once per process. Every failure is a :class:`gpufeed.errors.DecodeError`.

::

    header = read_header(data)            # size, format, EXIF orientation; no pixels decoded
    img = decode(data, min_height=256, min_width=256)   # DCT-scaled JPEG decode
    y, cb, cr = decode_planes(data, header=header)      # YCbCr planes, no colour conversion
    if row_decodable(data, header):                     # a sequential JPEG: its top rows only
        valid = decode_rows(data, 100, header=header, out=np.empty((h, w, 3), np.uint8))
"""

from gpufeed.decoders._backends import backends
from gpufeed.decoders._decode import (
    apply_orientation,
    choose_factor,
    decode,
    decode_planes,
    min_size_for_scale,
    plane_subsampling,
    scaled_size,
)
from gpufeed.decoders._header import ImageHeader, read_header
from gpufeed.decoders._rows import ROW_MARGIN, decode_rows, row_decodable

__all__ = [
    "ImageHeader",
    "ROW_MARGIN",
    "apply_orientation",
    "backends",
    "choose_factor",
    "decode",
    "decode_planes",
    "decode_rows",
    "min_size_for_scale",
    "plane_subsampling",
    "read_header",
    "row_decodable",
    "scaled_size",
]
