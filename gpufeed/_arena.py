"""The shared arena: one memfd per loader, cut into fixed-capacity batch slots.

The parent owns the file and decides which slot each task writes into; a worker maps the slot
it was told to use, writes the batch's tensor payloads there and sends back only offsets. The
parent hands the user tensors that are *views* of the slot, and puts the slot back on the free
list when the last of those views dies (``weakref.finalize`` on the lease's memoryview), so a batch
stays valid for exactly as long as the user holds it.

A slot's capacity is virtual: a memfd allocates pages on first write, so an unused tail costs
nothing, and pages written once are reused by later batches (no page zeroing per batch, unlike a
fresh shared-memory segment per batch). The memfd has no name in any filesystem, so a killed
process leaks nothing, and it is not bounded by the size of ``/dev/shm``.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from multiprocessing import reduction

from typing import Any, Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

PAGE_BYTES = mmap.PAGESIZE
ALIGN_BYTES = 64


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


CHUNK_BASE_SLOTS = 4


def chunk_of(slot: int) -> tuple[int, int, int]:
    """(chunk number, first slot, slot count) of the chunk holding ``slot``.

    Slots are mapped in chunks of 4, 8, 16, ... slots: each mmap object holds a duplicated file
    descriptor, so one mapping per slot would run into the descriptor limit when a user keeps
    many batches; chunks keep mappings (and descriptors) logarithmic in the slot count.
    """
    chunk = (slot // CHUNK_BASE_SLOTS + 1).bit_length() - 1
    first = CHUNK_BASE_SLOTS * ((1 << chunk) - 1)
    return chunk, first, CHUNK_BASE_SLOTS << chunk


def map_chunk(fd: int, slot_bytes: int, slot: int) -> tuple[int, mmap.mmap]:
    """Map the chunk holding ``slot``; returns (chunk number, mapping)."""
    chunk, first, count = chunk_of(slot)
    return chunk, mmap.mmap(fd, count * slot_bytes, mmap.MAP_SHARED, offset=first * slot_bytes)


def _create_fd(name: str) -> int:
    """An anonymous shared file: memfd on Linux, an unlinked temporary file elsewhere."""
    if hasattr(os, "memfd_create") and sys.platform.startswith("linux"):
        return os.memfd_create(name, os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix=name + "-")
    os.unlink(path)
    return fd


class Arena:
    """Parent side of the arena: owns the file descriptor, the slot mappings and the free list.

    Thread-safe: slots are released from ``weakref.finalize`` callbacks, which run in whatever
    thread drops the user's last reference.
    """

    def __init__(self, slot_bytes: int, name: str = "gpufeed-arena", release_pages: bool = False) -> None:
        self.slot_bytes = _round_up(slot_bytes, PAGE_BYTES)
        # Give a freed slot's pages back to the OS (MADV_REMOVE). Costs a zero-fill when the slot
        # is written again: worth it when batches take long to build (decoding), so idle and
        # half-built slots do not hold whole batches of memory; not when batches are memcpys.
        self.release_pages = release_pages and hasattr(mmap, "MADV_REMOVE")
        self._pinned: set[int] = set()  # page-locked slots (CUDA) keep their pages
        self._fd = _create_fd(name)
        self._owner_pid = os.getpid()
        self._maps: list[mmap.mmap] = []  # one per chunk
        self._num_slots = 0
        self._free: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        self._users = 0  # live iterators; closing waits for the last one
        self._close_requested = False
        self._close_hooks: list[Callable[[], None]] = []

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def num_slots(self) -> int:
        """Slots created so far (in use or free)."""
        return self._num_slots

    def handle(self) -> ArenaHandle:
        """What a worker needs to map slots (picklable for spawn/forkserver)."""
        return ArenaHandle(self._fd, self.slot_bytes)

    def acquire(self) -> int:
        """A free slot id; grows the file by one slot when none is free."""
        with self._lock:
            if self._closed:
                raise RuntimeError("gpufeed arena is closed; create a new iterator from a live loader")
            if self._free:
                return self._free.pop()
            slot = self._num_slots
            chunk, first, count = chunk_of(slot)
            if chunk == len(self._maps):
                os.ftruncate(self._fd, (first + count) * self.slot_bytes)
                self._maps.append(map_chunk(self._fd, self.slot_bytes, slot)[1])
            self._num_slots += 1
            return slot

    def release(self, slot: int) -> None:
        """Return ``slot`` to the free list (nobody may read or write it any more)."""
        with self._lock:
            if self._closed:
                return
            if self.release_pages and slot not in self._pinned:
                chunk, first, _ = chunk_of(slot)
                self._maps[chunk].madvise(mmap.MADV_REMOVE, (slot - first) * self.slot_bytes, self.slot_bytes)
            self._free.append(slot)

    def mark_pinned(self, slot: int) -> None:
        """The slot is page-locked (cudaHostRegister): its pages must stay."""
        self._pinned.add(slot)

    def slot_tensor(self, slot: int) -> torch.Tensor:
        """The whole of ``slot`` as a uint8 tensor, for the parent's own short-lived writes."""
        chunk, first, _ = chunk_of(slot)
        start = (slot - first) * self.slot_bytes
        return torch.frombuffer(self._maps[chunk], dtype=torch.uint8)[start : start + self.slot_bytes]

    def lease(self, slot: int, nbytes: int) -> memoryview:
        """A view of the first ``nbytes`` of ``slot``; the slot is released when it dies."""
        chunk, first, _ = chunk_of(slot)
        start = (slot - first) * self.slot_bytes
        view = memoryview(self._maps[chunk])[start : start + max(nbytes, 1)]
        weakref.finalize(view, self.release, slot)
        return view

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` before the mappings go (e.g. cudaHostUnregister)."""
        self._close_hooks.append(hook)

    def attach(self) -> None:
        """An iterator starts using the arena (it stays open until every user detached)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("gpufeed arena is closed; iterate a live loader")
            self._users += 1

    def detach(self) -> None:
        """An iterator is done; closes the arena if the loader already asked for it."""
        with self._lock:
            self._users -= 1
            close_now = self._users == 0 and self._close_requested
        if close_now:
            self.close()

    def close(self) -> None:
        """Close now, or as soon as the last iterator detaches (a loader may die before the
        iterator it made: ``for b in FastLoader(...)``). Idempotent.

        Unmaps what nobody holds and closes the file.

        Mappings still exported to user tensors stay alive until those tensors die (their
        memoryviews keep the mmap objects), so closing never invalidates a batch the user holds.
        """
        with self._lock:
            if self._closed or os.getpid() != self._owner_pid:
                return
            if self._users > 0:
                self._close_requested = True
                return
            self._closed = True
            maps, self._maps, self._free = self._maps, [], []
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()
        for m in maps:
            try:
                m.close()
            except BufferError:
                pass  # a user still holds a batch in this slot; the GC unmaps it later
        os.close(self._fd)


@dataclass(frozen=True)
class ArenaHandle:
    """Worker side reference to the arena: the file descriptor and the slot size in bytes."""

    fd: int
    slot_bytes: int

    def __reduce__(self):  # spawn/forkserver: hand the descriptor to the child process
        return (_rebuild_handle, (reduction.DupFd(self.fd), self.slot_bytes))


def _rebuild_handle(dup, slot_bytes: int) -> ArenaHandle:
    return ArenaHandle(dup.detach(), slot_bytes)


class SlotWriter:
    """Worker side: maps slots on first use and bump-allocates tensor payloads inside one.

    ``begin(slot)`` starts a task, ``alloc``/``tensor`` hand out 64-byte aligned regions,
    ``end()`` finishes it. Allocation fails (returns None) when a batch outgrows the slot; the
    caller then falls back to pickling that payload.
    """

    def __init__(self, handle: ArenaHandle) -> None:
        self._handle = handle
        self._chunks: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self._bytes: torch.Tensor | None = None
        self._base = 0
        self.pos = 0
        self._allocs: list[tuple[int, int]] = []  # (offset, nbytes) of this task's regions, ascending

    @property
    def active(self) -> bool:
        return self._bytes is not None

    @property
    def buffer(self) -> torch.Tensor:
        """The current slot as a uint8 tensor (between ``begin`` and ``end``)."""
        assert self._bytes is not None  # internal invariant
        return self._bytes

    def seek(self, pos: int) -> None:
        """Move the allocation cursor (regions below ``pos`` are laid out by the caller)."""
        self.pos = pos

    def stage(self, data: Any) -> tuple[int, int] | None:
        """Copy ``data`` (bytes-like) to a fresh region; (offset, nbytes) or None if full."""
        view = memoryview(data).cast("B")
        off = self.alloc(view.nbytes)
        if off is None:
            return None
        self.region(off, view.nbytes).numpy()[:] = np.frombuffer(view, np.uint8)
        return off, view.nbytes

    def begin(self, slot: int) -> None:
        chunk, first, _ = chunk_of(slot)
        mapped = self._chunks.get(chunk)
        if mapped is None:
            _, m = map_chunk(self._handle.fd, self._handle.slot_bytes, slot)
            mapped = self._chunks[chunk] = (m, torch.frombuffer(m, dtype=torch.uint8))
        size = self._handle.slot_bytes
        start = (slot - first) * size
        self._bytes = mapped[1][start : start + size]
        self._base = self._bytes.data_ptr()
        self.pos = 0
        self._allocs = []

    def end(self) -> None:
        self._bytes = None

    def owns_storage(self, storage_ptr: int) -> bool:
        """Whether a storage is one of this process's arena mappings (never pickle it inline:
        it is a whole chunk, gigabytes of virtual memory)."""
        return any(t.data_ptr() == storage_ptr for _, t in self._chunks.values())

    def offset_of(self, ptr: int) -> int:
        return ptr - self._base

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a fresh region of ``nbytes`` in the current slot, or None if it is full."""
        if self._bytes is None:
            return None
        start = _round_up(self.pos, ALIGN_BYTES)
        if start + nbytes > len(self._bytes):
            return None
        self.pos = start + nbytes
        self._allocs.append((start, nbytes))
        return start

    def mark(self, offset: int, nbytes: int) -> None:
        """Declare a region laid out by the caller (not by ``alloc``), e.g. the image rows."""
        bisect.insort(self._allocs, (offset, nbytes))

    def region_of(self, ptr: int) -> tuple[int, int] | None:
        """(offset, nbytes) of the allocated region holding address ``ptr``, if any.

        Tensors carved from one region keep sharing one storage in the parent, as they would
        have in torch (views of a collated batch, for instance).
        """
        off = ptr - self._base
        i = bisect.bisect_right(self._allocs, (off, float("inf"))) - 1
        if i >= 0:
            start, nbytes = self._allocs[i]
            if start <= off < start + nbytes:
                return start, nbytes
        return None

    def region(self, offset: int, nbytes: int) -> torch.Tensor:
        """uint8 tensor over ``[offset, offset + nbytes)`` of the current slot."""
        assert self._bytes is not None  # internal invariant: only called between begin and end
        return self._bytes[offset : offset + nbytes]

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """A contiguous tensor of ``shape``/``dtype`` inside the slot, or None if it is full."""
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if nbytes == 0:
            return None
        off = self.alloc(nbytes)
        if off is None:
            return None
        return self.region(off, nbytes).view(dtype).view(shape)
