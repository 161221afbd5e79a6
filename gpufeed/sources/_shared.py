"""Read-only numpy arrays that reach spawned workers as a file descriptor, not as a copy.

A sample table (path bytes, offsets, labels) of 10M samples is about 700 MB. Under the ``fork``
start method workers share it for free (it is never written, so no page is ever copied). Under
``spawn`` and ``forkserver`` the dataset is pickled into every worker, and a plain numpy array
is pickled by value: 700 MB written, sent and rebuilt once per worker, and resident once per
worker.

:func:`share` keeps an array of at least :data:`SHARE_MIN_BYTES` in an anonymous shared file
(``memfd_create`` on Linux, sealed against writes; an unlinked temporary file elsewhere),
mapped read-only. When multiprocessing pickles it (its ``ForkingPickler``, which
``Process.start()`` uses under spawn/forkserver and ``Connection.send`` uses), the array
travels as that descriptor (``multiprocessing.reduction.DupFd``, the mechanism that also passes
the loader's arena to its workers) plus dtype and shape: a few hundred bytes. The worker maps
the same pages read-only, so every worker and the parent hold one copy between them.

Plain ``pickle.dumps`` (a user saving a dataset) still writes the full data: the descriptor
would mean nothing in another process or a later run.

The file lives as long as the array that created it: the descriptor is closed by
``weakref.finalize`` when that array is collected (views of it keep the mapping, not the
descriptor; pickling such a view copies it). Nothing has a name in any filesystem, so a killed
process leaks nothing. Each shared array holds two descriptors (its own, and the duplicate
Python's ``mmap`` keeps), hence the size threshold.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
import weakref
from multiprocessing import reduction
from typing import Any

import numpy as np

#: Arrays at least this large live in a shared file; smaller ones are pickled by value (a
#: descriptor costs more than copying them). 1 MiB is 16k samples' paths.
SHARE_MIN_BYTES = 1 << 20
MEMFD_NAME = "gpufeed-table"


class SharedArray(np.ndarray):
    """A read-only ndarray; see the module docstring for how it crosses to worker processes.

    Build one with :func:`share`. Only the array ``share`` returned owns the shared file
    (``shared_fd``); views and results of arithmetic are ordinary arrays of this type.
    """

    shared_fd: int | None = None

    def __array_wrap__(self, obj: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # arithmetic and reductions give plain arrays and scalars, as on any ndarray
        out = np.asarray(obj)
        return out[()] if return_scalar else out

    def __reduce__(self) -> tuple[Any, ...]:
        # plain pickle: the data itself, shared again (if large) when loaded
        return share, (np.asarray(self),)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return self.__reduce__()


def share(values: Any) -> SharedArray:
    """``values`` as a read-only :class:`SharedArray` (a copy: the input is not kept).

    At least :data:`SHARE_MIN_BYTES`: backed by an anonymous shared file; smaller: private.
    """
    arr = np.ascontiguousarray(values)
    if arr.dtype.hasobject:
        raise TypeError(f"cannot share an array of Python objects (dtype {arr.dtype}); "
                        f"shared tables hold numbers and bytes only")
    if arr.nbytes < SHARE_MIN_BYTES or arr.nbytes == 0:
        out = arr.copy().view(SharedArray)
        out.setflags(write=False)
        return out
    fd = _create_fd(MEMFD_NAME)
    try:
        os.ftruncate(fd, arr.nbytes)
        m = mmap.mmap(fd, arr.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            dst = np.frombuffer(m, np.uint8)
            dst[:] = arr.reshape(-1).view(np.uint8)
            del dst  # the mapping cannot close while a view exports it
        finally:
            m.close()
        _seal(fd)
        return _map(fd, arr.dtype, arr.shape, populate=True)
    except BaseException:
        os.close(fd)
        raise


def _map(fd: int, dtype: np.dtype, shape: tuple[int, ...], populate: bool = False) -> SharedArray:
    """A read-only array over the whole of ``fd``; it owns ``fd`` (closed when it dies).

    ``populate``: map every page now (the creator does). Pages of a shared file count as private
    memory (USS) of each process that maps them alone; mapped in the creator from the start,
    they count there, once, and as shared in every worker that reads them.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    m = mmap.mmap(fd, nbytes, flags, mmap.PROT_READ)
    out = np.frombuffer(m, dtype=dtype).reshape(shape).view(SharedArray)
    out.shared_fd = fd
    weakref.finalize(out, os.close, fd)
    # Registered with the first shared array, not at import (no import-time side effects): only
    # arrays made here own a descriptor, and the entry is one dict item, set again harmlessly.
    reduction.ForkingPickler.register(SharedArray, _reduce_for_process)
    return out


def _reduce_for_process(arr: SharedArray) -> tuple[Any, ...]:
    """multiprocessing's pickling of a SharedArray: the descriptor if it owns one, else data."""
    if arr.shared_fd is None:
        return share, (np.asarray(arr),)
    return _attach, (reduction.DupFd(arr.shared_fd), arr.dtype.str, arr.shape)


def _attach(dup: Any, dtype: str, shape: tuple[int, ...]) -> SharedArray:
    """Worker side: map the parent's file (``dup.detach()`` gives its descriptor here)."""
    return _map(dup.detach(), np.dtype(dtype), tuple(shape))



def _create_fd(name: str) -> int:
    """An anonymous file: a sealable memfd on Linux, an unlinked temporary file elsewhere."""
    if hasattr(os, "memfd_create") and sys.platform.startswith("linux"):
        return os.memfd_create(name, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    fd, path = tempfile.mkstemp(prefix=name + "-")
    os.unlink(path)
    return fd


def _seal(fd: int) -> None:
    """Forbid writes, growth and shrinking of a memfd (best effort: not every file seals)."""
    import fcntl

    seals = ("F_SEAL_WRITE", "F_SEAL_GROW", "F_SEAL_SHRINK", "F_SEAL_SEAL")
    if not hasattr(fcntl, "F_ADD_SEALS"):
        return
    flags = 0
    for name in seals:
        flags |= getattr(fcntl, name, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, flags)
    except OSError:
        pass  # an unlinked temporary file: read-only mappings still keep it unwritten
