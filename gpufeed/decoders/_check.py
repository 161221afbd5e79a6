"""check_jpeg(): is a JPEG whole? A 1/8-scale greyscale decode by libjpeg-turbo, thread-safe.

PyTurboJPEG reports a truncated JPEG only through ``warnings.warn``, which a caller can catch
only with process-wide state (:func:`gpufeed.decoders._decode._turbo_call` holds a lock for it),
so threads checking files (``gpufeed pack``) would take turns. Here libjpeg-turbo's TurboJPEG
API is called directly (``ctypes``, which releases the GIL): ``tjDecompress2`` returns -1 on a
warning as on an error, and ``tjGetErrorStr2`` says which, per handle, so every thread checks
on its own. A 1/8-scale decode still reads the whole entropy-coded stream; greyscale output
skips the chroma IDCT and colour conversion. The library is the one PyTurboJPEG loaded.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from gpufeed.decoders import _backends
from gpufeed.decoders._header import Buffer, ImageHeader, as_buffer
from gpufeed.errors import DecodeError

__all__ = ["check_jpeg"]

_TJPF_GRAY = 6  # turbojpeg.h: TJPF_GRAY
_BENIGN = ("extraneous bytes before marker",)  # as gpufeed.decoders._decode._BENIGN_WARNINGS
_lock = threading.Lock()
_library: list[Any] = []  # [the CDLL, or None when libturbojpeg is not loaded]: set on first use


def _turbojpeg() -> Any:
    """libturbojpeg with the four functions used here typed, or None (not loaded)."""
    with _lock:
        if not _library:
            _library.append(_load())
        return _library[0]


def _load() -> Any:
    state = _backends.turbo_state()
    if state.decoder is None or not state.library:
        return None
    try:
        lib = ctypes.CDLL(state.library)
        lib.tjInitDecompress.restype = ctypes.c_void_p
        lib.tjInitDecompress.argtypes = []
        lib.tjDestroy.argtypes = [ctypes.c_void_p]
        lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong,
                                      ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int]
        lib.tjGetErrorStr2.argtypes = [ctypes.c_void_p]
        lib.tjGetErrorStr2.restype = ctypes.c_char_p
    except (OSError, AttributeError):  # another library, or a libjpeg-turbo before 2.0
        return None
    return lib


def check_jpeg(data: Buffer, header: ImageHeader) -> bool:
    """Decode the JPEG ``data`` (whose :func:`~gpufeed.read_header` is ``header``) at
    1/8 scale in greyscale and drop the pixels; :class:`~gpufeed.errors.DecodeError` when
    libjpeg-turbo reports an error or a warning (truncated, corrupt) other than the benign
    "extraneous bytes before marker". Returns False, checking nothing, when this cannot run
    (libturbojpeg not loaded, not a JPEG, a CMYK JPEG): the caller decodes instead."""
    lib = _turbojpeg()
    if lib is None or header.fmt != "jpeg" or header.cmyk:
        return False
    buf = as_buffer(data)
    src = np.frombuffer(buf, np.uint8)
    height = -(-header.encoded_height // 8)
    width = -(-header.encoded_width // 8)
    dst = np.empty(height * width, np.uint8)
    handle = lib.tjInitDecompress()
    if not handle:
        raise MemoryError("libturbojpeg could not make a decompressor (tjInitDecompress)")
    try:
        status = lib.tjDecompress2(handle, src.ctypes.data, src.size, dst.ctypes.data, width, 0,
                                   height, _TJPF_GRAY, 0)
        message = lib.tjGetErrorStr2(handle).decode(errors="replace") if status != 0 else ""
    finally:
        lib.tjDestroy(handle)
    if status != 0 and not any(benign in message for benign in _BENIGN):
        raise DecodeError(f"turbojpeg: {message} ({len(buf)} bytes): truncated or corrupt JPEG")
    return True
