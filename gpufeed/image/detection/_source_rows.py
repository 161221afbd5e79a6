"""A sample's source image, decoded only as far down as its ops read it.

The per-sample path decodes every image before its joint ops draw a crop, so the rows below the
crop were entropy-decoded for nothing. Here a sequential JPEG becomes a :class:`JpegRows`, a
:class:`~gpufeed.image.detection._sample.RowSource` under the sample's image window: a crop moves
the window without reading pixels, and the first op that needs pixels decodes the rows down to
the window's bottom (:func:`gpufeed.decoders.decode_rows`: the same bytes as a full decode).
An op that needs the whole image (a whole-image mean, an op run as given) reads it all, which is
the full decode it always was. Other images are decoded at once, as before.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpufeed.decoders import ImageHeader, decode, decode_rows, read_header, row_decodable
from gpufeed.decoders._header import Buffer
from gpufeed.errors import DecodeError
from gpufeed.image._transforms import stored_orientation
from gpufeed.image.detection._sample import Sample

__all__ = ["JpegRows", "decode_source", "is_decode_failure", "source_sample", "source_size"]


class JpegRows:
    """A sequential JPEG (``row_decodable``) as a row source: ``rows(stop)`` decodes the rows
    [0, ``stop``) into one (H, W, 3) array, again from the top if a later call asks for more.
    ``decode_s``: seconds spent decoding so far; ``error``: the DecodeError a decode raised."""

    __slots__ = ("data", "header", "shape", "decode_s", "decodes", "error", "_out", "_valid")

    def __init__(self, data: Buffer, header: ImageHeader) -> None:
        self.data, self.header = data, header
        self.shape = (header.height, header.width, 3)
        self.decode_s = 0.0
        self.decodes = 0
        self.error: DecodeError | None = None
        self._out: np.ndarray | None = None
        self._valid = 0

    def rows(self, stop: int) -> np.ndarray:
        """The image array, its rows [0, ``stop``) decoded (raises DecodeError)."""
        if self._out is None:
            self._out = np.empty(self.shape, np.uint8)
        if stop > self._valid:
            t0 = time.perf_counter()
            try:
                self._valid = decode_rows(self.data, stop, header=self.header, out=self._out)
            except DecodeError as exc:
                self.error = exc
                raise
            finally:
                self.decode_s += time.perf_counter() - t0
                self.decodes += 1
        return self._out


def decode_source(data: Buffer) -> np.ndarray | JpegRows:
    """The image of ``data`` at stored orientation (EXIF ignored, as PIL's ``Image.open``): a
    :class:`JpegRows` for a sequential JPEG, else the decoded (H, W, 3) uint8 array. Raises
    DecodeError for an unreadable header (and for any other image, a failed decode)."""
    header = stored_orientation(read_header(data))
    if row_decodable(data, header):
        return JpegRows(data, header)
    return decode(data, header=header)


def source_sample(image: np.ndarray | JpegRows, target: Any) -> Sample:
    """The sample of :func:`decode_source`'s ``image`` and ``target``."""
    if isinstance(image, JpegRows):
        return Sample.over_rows(image, target)
    return Sample(image, target)


def source_size(image: np.ndarray | JpegRows) -> tuple[int, int]:
    """(H, W) of :func:`decode_source`'s ``image``."""
    return int(image.shape[0]), int(image.shape[1])


def is_decode_failure(image: np.ndarray | JpegRows, exc: DecodeError) -> bool:
    """Whether ``exc``, raised while a sample ran, is the lazy decode of its ``image`` failing
    (the file is bad), not an error of an op."""
    return isinstance(image, JpegRows) and exc is image.error
