"""The shared arena: one memfd per loader, cut into fixed-capacity batch slots.

The parent owns the file and the slot ids; a worker writes a batch's tensor payloads into a slot
and sends back only offsets. The parent hands the user tensors that are *views* of the slot, and
frees the slot when the last of those views dies (``weakref.finalize`` on the lease's
memoryview), so a batch stays valid for exactly as long as the user holds it.

A slot's capacity is virtual: a memfd allocates pages on first write, so an unwritten slot or
tail costs nothing. Pages written once are *warm*: rewriting them costs no page faults, while
faulting fresh shared pages costs about 0.8 ms per MiB here (7 ms for a 9.6 MB batch of
64x3x224x224 uint8, as much as decoding a dozen JPEGs). So slots are bound late:

* Each task is dispatched with a *cold* fallback slot (never written, or emptied with
  MADV_REMOVE): holding it costs no memory while the task waits in the worker's queue.
* Freed slots are warm. Their ids go into the *warm pipe*, a pipe of 4-byte slot ids shared by
  the parent (writer) and every worker (readers), like a jobserver's tokens: a write of 4 bytes is
  atomic and every read takes 4, so each id reaches exactly one reader.
* A worker starting a task takes a warm id if one is there (non-blocking read), tells the parent
  (a ``claim`` message) and writes there; the untouched fallback goes back to the cold list.
  Otherwise it writes the fallback, which becomes warm when freed.

Resident memory is then the batches being built, waiting or held, not one batch per task
dispatched. A freed slot that would be surplus gives its pages back (MADV_REMOVE) and turns
cold: when ``warm_cap`` ids already wait (memory falls back after the user drops many held
batches), or when at every release of a recent window some ids were waiting anyway (slots kept
warm for nothing: as many as waited throughout are emptied; each costs one refault, not one per
batch). A spare that a worker took before each free is kept: it is what lets a worker that
starts before the consumer frees its batch write warm pages. (``Engine.wait`` also empties the
waiting slots when the loader stalls for much longer than a task takes.)
The memfd has no name in any filesystem, so a killed process leaks nothing, and it is not
bounded by the size of ``/dev/shm``.

The states a slot goes through, and the verbs that move it, are defined in
``gpufeed._engine.ledger``.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import mmap
import os
import struct
import sys
import tempfile
import termios
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch

from gpufeed._engine.layout import ALIGN_BYTES

log = logging.getLogger(__name__)

PAGE_BYTES = mmap.PAGESIZE


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


CHUNK_BASE_SLOTS = 4
TRIM_WINDOW = 32  # releases over which warm ids that always waited count as surplus


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
    thread drops the user's last reference, or inside a garbage collection that an allocation
    made while this thread holds the lock set off (a batch in a reference cycle): so the lock is
    reentrant, and every locked region stays correct if a release runs in the middle of it.
    """

    def __init__(self, slot_bytes: int, name: str = "gpufeed-arena", warm_cap: int = 2) -> None:
        self.slot_bytes = _round_up(slot_bytes, PAGE_BYTES)
        self.warm_cap = max(1, int(warm_cap))  # most warm ids left waiting in the pipe
        self._pinned: set[int] = set()  # page-locked slots (CUDA): unpinned before they are emptied
        self._unpin_hooks: list[Callable[[int], None]] = []
        self._fd = _create_fd(name)
        self._warm_r, self._warm_w = os.pipe()
        os.set_blocking(self._warm_r, False)
        os.set_blocking(self._warm_w, False)
        self.emptied = 0  # slots whose pages were given back (each costs a refault when reused)
        self._window_min = 1 << 30  # fewest ids seen waiting at a release in this window
        self._window_count = 0
        self._owner_pid = os.getpid()
        self._maps: list[mmap.mmap] = []  # one per chunk
        self._num_slots = 0
        self._cold: list[int] = []  # free slots without pages
        self._leased: dict[int, int] = {}  # slot -> live leases (one, unless the books are wrong)
        self._lock = threading.RLock()
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

    def resident_bytes(self, slot: int | None = None) -> int:
        """Bytes of memory the memfd (or only ``slot``) holds now: pages written and not given
        back, found by walking its data extents (SEEK_DATA/SEEK_HOLE); 0 where that is not
        supported."""
        total, pos = 0, 0
        try:
            end = os.fstat(self._fd).st_size
            if slot is not None:
                pos, end = slot * self.slot_bytes, min(end, (slot + 1) * self.slot_bytes)
            while pos < end:
                start = os.lseek(self._fd, pos, os.SEEK_DATA)
                if start >= end:
                    break
                pos = min(end, os.lseek(self._fd, start, os.SEEK_HOLE))
                total += pos - start
        except OSError:  # ENXIO: no data past ``pos``; others: unsupported here
            pass
        return total

    def handle(self) -> ArenaHandle:
        """What a worker needs to map slots and take warm ones (picklable for spawn/forkserver)."""
        return ArenaHandle(self._fd, self.slot_bytes, self._warm_r)

    def acquire(self, warm: bool = False) -> int:
        """A free slot id: a cold one (growing the file when none is free), or with ``warm`` a
        warm one from the pipe when there is one (for a slot the parent writes itself)."""
        if warm:
            slot = take_warm(self._warm_r)
            if slot is not None:
                return slot
        with self._lock:
            if self._closed:
                raise RuntimeError("gpufeed arena is closed; create a new iterator from a live loader")
            if self._cold:
                return self._cold.pop()
            slot = self._num_slots
            chunk, first, count = chunk_of(slot)
            if chunk == len(self._maps):
                os.ftruncate(self._fd, (first + count) * self.slot_bytes)
                self._maps.append(map_chunk(self._fd, self.slot_bytes, slot)[1])
            self._num_slots += 1
            return slot

    def acquire_recent(self) -> int:
        """A free slot for the parent to write now: the warm one freed last (its pages are the
        likeliest to be in the CPU caches still), else as ``acquire()``.

        It reads every id waiting in the warm pipe and writes back the others, oldest first. A
        worker reading the pipe meanwhile finds none and writes its fallback (slower, never
        wrong); when the plug-in binds slots in the parent (the cache), workers never read it.
        """
        with self._lock:
            waiting = self.warm_waiting()
            if waiting > 0:
                try:
                    raw = os.read(self._warm_r, 4 * waiting)
                except (BlockingIOError, InterruptedError):
                    raw = b""
                usable = len(raw) - len(raw) % 4  # never a partial id: every write is 4 bytes
                if usable:
                    if usable > 4:
                        os.write(self._warm_w, raw[: usable - 4])
                    slot: int = struct.unpack("<i", raw[usable - 4 : usable])[0]
                    return slot
        return self.acquire()

    def warm_waiting(self) -> int:
        """Warm ids waiting in the pipe now (FIONREAD; 0 where that is not supported)."""
        buf = bytearray(4)
        try:
            fcntl.ioctl(self._warm_r, termios.FIONREAD, buf)
        except OSError:
            return 0
        return int.from_bytes(buf, sys.byteorder) // 4

    def release(self, slot: int) -> None:
        """Free a slot that may have been written: its id goes to the warm pipe, unless it would
        be surplus; then its pages go back to the OS (MADV_REMOVE) and it turns cold.

        Surplus: ``warm_cap`` ids already wait (over budget), or the last ``TRIM_WINDOW``
        releases each found at least one id waiting: that many ids were never needed in the
        window, and they are all emptied (this slot first, the rest from the pipe). A spare id
        that some worker took before the next free keeps its pages: it absorbs a free that comes
        after the worker's take (see docs/design/engine-lifecycle.md, "Trimming").

        A no-op in a forked child: its copy of a batch died, but the parent still holds the slot,
        and the pipe is shared with the parent's workers.
        """
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            if self._closed:
                return
            waiting = self.warm_waiting()
            self._window_min = min(self._window_min, waiting)
            self._window_count += 1
            unneeded = 0  # ids waiting at every release of a whole window
            if self._window_count >= TRIM_WINDOW:
                unneeded = self._window_min
                self._window_min, self._window_count = 1 << 30, 0
            surplus = waiting >= self.warm_cap or unneeded > 0
            if surplus:
                self._empty(slot)
            else:
                try:
                    os.write(self._warm_w, struct.pack("<i", slot))
                except BlockingIOError:  # 16k ids waiting: cannot happen short of a leak
                    self._empty(slot)
            if unneeded > 1:
                self._trim_pipe(unneeded - 1)

    def _empty(self, slot: int) -> None:
        """Give ``slot``'s pages back to the OS and make it cold (lock held). A page-locked slot
        is unpinned first (the unpin hooks: ``cudaHostUnregister``): a free slot is read by no
        copy, and memory must not be page-locked while it is removed."""
        if slot in self._pinned:
            self._pinned.discard(slot)
            for hook in self._unpin_hooks:
                hook(slot)
        if hasattr(mmap, "MADV_REMOVE"):
            chunk, first, _ = chunk_of(slot)
            self._maps[chunk].madvise(mmap.MADV_REMOVE, (slot - first) * self.slot_bytes, self.slot_bytes)
            self.emptied += 1
        self._cold.append(slot)

    def trim_waiting(self) -> int:
        """Empty every warm slot waiting in the pipe (page-locked ones are unpinned first);
        returns how many ids it took from the pipe.

        For a parent that has waited far longer than a task takes (``Engine.wait``): the loader
        is idle or stalled, and a slot waiting now is not needed soon.
        """
        return self._trim_pipe(None)

    def _trim_pipe(self, limit: int | None) -> int:
        """Take up to ``limit`` (None: all) ids from the pipe, oldest first, and empty their
        slots. Returns how many were taken."""
        taken: list[int] = []
        while (limit is None or len(taken) < limit) and (slot := take_warm(self._warm_r)) is not None:
            taken.append(slot)
        with self._lock:
            if self._closed:
                return 0
            for slot in taken:
                self._empty(slot)
        return len(taken)

    def free_slots(self) -> int:
        """Slots nobody holds: cold ones plus warm ids waiting in the pipe."""
        with self._lock:
            return len(self._cold) + self.warm_waiting()

    def release_cold(self, slot: int) -> None:
        """Free a slot nobody wrote (a fallback the worker did not use)."""
        with self._lock:
            if not self._closed:
                self._cold.append(slot)

    def mark_pinned(self, slot: int) -> None:
        """The slot is page-locked (cudaHostRegister): the unpin hooks run before it is emptied."""
        with self._lock:
            self._pinned.add(slot)

    def add_unpin_hook(self, hook: Callable[[int], None]) -> None:
        """Run ``hook(slot)`` before a page-locked slot's pages are given back (it unregisters
        the slot: ``gpufeed.cuda._feed.HostRegistrar.unpin``)."""
        self._unpin_hooks.append(hook)

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
        with self._lock:
            self._leased[slot] = self._leased.get(slot, 0) + 1
        weakref.finalize(view, self._end_lease, slot)
        return view

    def _end_lease(self, slot: int) -> None:
        """The last view of a lease died: the slot is free."""
        if os.getpid() != self._owner_pid:
            return  # a forked child's copy of the batch died; see ``release``
        with self._lock:
            count = self._leased.pop(slot, 0) - 1
            if count > 0:
                self._leased[slot] = count
        self.release(slot)

    def snapshot(self) -> ArenaSnapshot:
        """Where the slots the arena knows of are now: free ones, page-locked ones waiting on a
        copy, leased ones (the rest are held by iterators: see ``SlotLedger.slot_states``).

        For tests and diagnostics: it reads the warm pipe by draining it and writing the ids back
        in order, so a worker reading meanwhile finds none and writes its cold fallback (slower,
        never wrong).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(
                    "gpufeed arena is closed: no slots to describe; snapshot a live loader's arena"
                )
            warm = []
            while (slot := take_warm(self._warm_r)) is not None:
                warm.append(slot)
            for slot in warm:
                os.write(self._warm_w, struct.pack("<i", slot))
            leased = dict(self._leased)  # a collection while iterating could end a lease
            return ArenaSnapshot(
                num_slots=self._num_slots,
                cold=tuple(self._cold),
                warm=tuple(warm),
                leased=tuple(slot for slot, n in leased.items() for _ in range(n)),
                pinned=frozenset(self._pinned),
            )

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
            maps, self._maps, self._cold = self._maps, [], []
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()
        for m in maps:
            try:
                m.close()
            except BufferError:
                pass  # a user still holds a batch in this slot; the GC unmaps it later
        for fd in (self._fd, self._warm_r, self._warm_w):
            os.close(fd)


def take_warm(fd: int) -> int | None:
    """A warm slot id from the pipe's read end ``fd``, or None if none is waiting (non-blocking)."""
    try:
        raw = os.read(fd, 4)
    except (BlockingIOError, InterruptedError):
        return None
    if len(raw) != 4:  # 0: the pipe is closed (the arena is gone); never a partial id
        return None
    slot: int = struct.unpack("<i", raw)[0]
    return slot


@dataclass(frozen=True)
class ArenaSnapshot:
    """Where an arena's slots were at one moment (``Arena.snapshot``). A slot listed twice, in
    one field or across fields, is a bookkeeping error."""

    num_slots: int  # slots created so far
    cold: tuple[int, ...]  # the cold list (never page-locked: emptying unpins first)
    warm: tuple[int, ...]  # ids waiting in the warm pipe, oldest first
    leased: tuple[int, ...]  # slots of batches the user holds
    pinned: frozenset[int]  # page-locked slots, whatever their state


@dataclass(frozen=True)
class ArenaHandle:
    """Worker side reference to the arena: the memfd, the slot size in bytes, the warm pipe."""

    fd: int
    slot_bytes: int
    warm_fd: int

    def __reduce__(self) -> tuple[Callable[..., ArenaHandle], tuple[Any, int, Any]]:
        # spawn/forkserver: hand the descriptors to the child process
        return (_rebuild_handle, (reduction.DupFd(self.fd), self.slot_bytes, reduction.DupFd(self.warm_fd)))


def _rebuild_handle(dup: Any, slot_bytes: int, warm_dup: Any) -> ArenaHandle:
    """``dup``/``warm_dup``: what ``reduction.DupFd`` returned in the parent (``detach()`` gives
    the descriptor in this process)."""
    return ArenaHandle(dup.detach(), slot_bytes, warm_dup.detach())


class SlotWriter:
    """Worker side: maps slots on first use and bump-allocates tensor payloads inside one.

    ``begin(slot)`` starts a task in ``slot``; ``begin_late(pick)`` starts one whose slot is
    chosen by ``pick()`` only when the first byte is about to be written (the later a warm slot
    is taken, the likelier the user has freed one: see the module docstring). ``alloc``/``tensor``
    hand out 64-byte aligned regions, ``end()`` finishes the task. Allocation fails (returns
    None) when a batch outgrows the slot; the caller then falls back to pickling that payload.
    """

    def __init__(self, handle: ArenaHandle) -> None:
        self._handle = handle
        self._chunks: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self._bytes: torch.Tensor | None = None
        self._pick: Callable[[], int] | None = None
        self._base = 0
        self.pos = 0
        self._allocs: list[tuple[int, int]] = []  # (offset, nbytes) of this task's regions, ascending

    @property
    def active(self) -> bool:
        return self._bytes is not None or self._pick is not None

    @property
    def capacity(self) -> int:
        """Bytes in a slot."""
        return self._handle.slot_bytes

    @property
    def buffer(self) -> torch.Tensor:
        """The current slot as a uint8 tensor (between ``begin`` and ``end``); binds it."""
        if self._pick is not None:
            self._bind(self._pick())
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
        self._bind(slot)
        self.pos = 0
        self._allocs = []

    def begin_late(self, pick: Callable[[], int]) -> None:
        self._pick = pick
        self._bytes = None
        self.pos = 0
        self._allocs = []

    def _bind(self, slot: int) -> None:
        self._pick = None
        chunk, first, _ = chunk_of(slot)
        mapped = self._chunks.get(chunk)
        if mapped is None:
            _, m = map_chunk(self._handle.fd, self._handle.slot_bytes, slot)
            mapped = self._chunks[chunk] = (m, torch.frombuffer(m, dtype=torch.uint8))
        size = self._handle.slot_bytes
        start = (slot - first) * size
        self._bytes = mapped[1][start : start + size]
        self._base = self._bytes.data_ptr()

    def end(self) -> None:
        self._bytes = None
        self._pick = None

    def owns_storage(self, storage_ptr: int) -> bool:
        """Whether a storage is one of this process's arena mappings (never pickle it inline:
        it is a whole chunk, gigabytes of virtual memory)."""
        return any(t.data_ptr() == storage_ptr for _, t in self._chunks.values())

    def offset_of(self, ptr: int) -> int:
        return ptr - self._base

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a fresh region of ``nbytes`` in the current slot, or None if it is full."""
        if not self.active:
            return None
        start = _round_up(self.pos, ALIGN_BYTES)
        if start + nbytes > self.capacity:
            return None
        self.buffer  # noqa: B018 (binds a late slot: a payload is about to be written)
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
        return self.buffer[offset : offset + nbytes]

    def stacked(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """``torch.stack(tensors)`` without a copy when the tensors already lie in the current
        slot as a stack would (contiguous, same shape and dtype, each right after the one
        before, as consecutive ``tensor`` calls place payloads whose size is a multiple of
        ``ALIGN_BYTES``): a view of that memory, which the tensors then share. None otherwise."""
        if not self.active or self._pick is not None or not tensors:
            return None
        first = tensors[0]
        nbytes = first.numel() * first.element_size()
        start = first.data_ptr() - self._base
        if nbytes == 0 or start < 0 or start + nbytes * len(tensors) > self.capacity:
            return None
        for i, t in enumerate(tensors):
            if (t.dtype != first.dtype or t.shape != first.shape or not t.is_contiguous()
                    or t.data_ptr() != first.data_ptr() + i * nbytes):
                return None
        return self.region(start, nbytes * len(tensors)).view(first.dtype).view(len(tensors), *first.shape)

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
