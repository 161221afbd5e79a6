"""Checking an image before it is written into a packed dataset (LMDB, tar shards).

A header check (:func:`gpufeed.read_header`) rejects empty files and non-images, but
not a JPEG cut short: its header is intact and libjpeg-turbo only warns when the data runs out.
:func:`verify_image` decodes at the smallest scale (JPEG: 1/8, PyTurboJPEG's scaling factor or
OpenCV's ``IMREAD_REDUCED_COLOR_8``; other formats at full size), which still walks the whole
entropy-coded stream, so truncation and corruption raise here rather than in training. JPEGs
go to :func:`gpufeed.decoders._check.check_jpeg` (greyscale, thread-safe: pack threads check in
parallel), the rest to :func:`gpufeed.decode`.

:func:`skip_or_raise` applies a loader-style ``on_error`` policy to a failed check: ``"raise"``
(an error naming the file, the sample index, what was found and the fix) or ``"skip"`` (the
caller leaves the file out and counts it).

What the check costs: see ``benchmarks/pack_verify.py`` (its docstring records a measurement).
"""

from __future__ import annotations

from gpufeed.decoders import decode, read_header
from gpufeed.decoders._check import check_jpeg
from gpufeed.errors import SKIP_HINT, DecodeError

__all__ = ["ON_ERROR_CHOICES", "check_on_error", "skip_or_raise", "verify_image"]

ON_ERROR_CHOICES = ("raise", "skip")


def verify_image(data: bytes | memoryview) -> None:
    """Raise :class:`~gpufeed.errors.DecodeError` unless ``data`` decodes as an image.

    JPEGs are decoded at 1/8 scale (the whole stream is still read: truncation is caught);
    PNG, WebP, BMP and TIFF at full size. Nothing is returned: the pixels are dropped. Safe to
    call from several threads at once.
    """
    header = read_header(data)
    if not check_jpeg(data, header):  # libjpeg-turbo directly: threads check side by side
        decode(data, min_height=1, min_width=1, header=header)


def check_on_error(on_error: str) -> str:
    """``on_error`` itself when it is ``"raise"`` or ``"skip"``; else ValueError."""
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"`on_error` must be 'raise' or 'skip'. Found: {on_error!r}.")
    return on_error


def skip_or_raise(exc: DecodeError, path: str, index: int, on_error: str, *,
                  tool: str = "pack") -> str:
    """For a file whose check failed: with ``on_error="skip"``, the one-line reason to log and
    count (the caller leaves the file out); with ``"raise"``, a DecodeError naming ``path``,
    sample ``index``, what was found and the fixes (``tool``: the command that packs)."""
    reason = f"{path} (sample index {index}): {exc}"
    if on_error == "skip":
        return reason
    raise DecodeError(f"cannot {tool} {reason}. Replace or delete the file and run the same "
                      f"{tool} again, or leave such files out with {SKIP_HINT}.") from exc
