"""The host cache shared by the processes of one job on a host: one memfd, fill-once rows
published with one 8-byte store, lock-free reads. docs/design/host-cache.md has the layout,
the protocol and why.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpufeed.cache._attach import ATTACH_TIMEOUT_S, MemberServer, attach_or_create, socket_prefix
from gpufeed.errors import GpufeedWarning

HEADER_BYTES = 4096
MAGIC = int.from_bytes(b"GPUFEED1", "little")
ALIGN = 64  # bytes: rows start on a cache line
LENGTH_BITS = 28
MAX_VALUE_BYTES = (1 << LENGTH_BITS) - 1  # 256 MiB: a longer value is not cached
MAX_BUDGET_BYTES = (1 << (64 - LENGTH_BITS)) * ALIGN  # 4 TiB
LOCK_TIMEOUT_S = 10.0
# Header words (uint64): magic, budget, reserved bytes, published bytes; the budget text at
# byte 64 (128 bytes); the namespace directory from byte 512: 56 entries of 8 words
# (digest x4, samples, table offset, ready, spare).
_W_MAGIC, _W_BUDGET, _W_RESERVED, _W_PUBLISHED = 0, 1, 2, 3
_TEXT_AT, _TEXT_BYTES = 64, 128
_DIR_WORD, _DIR_ENTRIES, _DIR_WORDS = 64, 56, 8


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def fingerprint(parts: Sequence[str]) -> bytes:
    """A 32-byte digest of what makes a row (dataset, transform, geometry, kind)."""
    h = hashlib.blake2b(digest_size=32)
    for part in parts:
        data = part.encode("utf-8", "surrogateescape")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.digest()


class SharedHostCache:
    """This process's attachment to its job's host cache (creating it when nobody serves it).

    Owns the memfd's descriptor, a descriptor of its own open file description (for the
    ``flock`` lock), the mapping and the socket server; ``close()`` is idempotent. Loaders
    take a ``namespace`` of it.
    """

    def __init__(self, job_key: str, budget_bytes: int, budget_text: str,
                 timeout_s: float | None = None) -> None:
        if not 0 < budget_bytes <= MAX_BUDGET_BYTES:
            raise ValueError(f"the host cache's budget must be 1 byte to 4 TiB. Found: {budget_bytes}.")
        self.job_key = job_key
        self._pid = os.getpid()
        self._tlock = threading.Lock()
        self._server: MemberServer | None = None
        self._lock_fd = -1
        self._fork_fds: list[int] = []  # closed in a forked child (a worker)
        prefix = socket_prefix(job_key)
        timeout_s = ATTACH_TIMEOUT_S if timeout_s is None else timeout_s

        def create() -> int:
            fd = os.memfd_create("gpufeed-host-cache", os.MFD_CLOEXEC)
            os.ftruncate(fd, HEADER_BYTES + budget_bytes)
            with mmap.mmap(fd, HEADER_BYTES) as head:
                words = np.frombuffer(head, np.uint64, HEADER_BYTES // 8)
                words[_W_BUDGET] = budget_bytes
                text = budget_text.encode()[:_TEXT_BYTES]
                head[_TEXT_AT : _TEXT_AT + len(text)] = text
                words[_W_MAGIC] = MAGIC
                del words
            self._serve(prefix, fd)  # served before the creation lock is released
            return fd

        self._fd, self.created = attach_or_create(prefix, create, timeout_s)
        try:
            size = os.fstat(self._fd).st_size
            self._map = mmap.mmap(self._fd, size)
            self._bytes = np.frombuffer(self._map, np.uint8)
            self._words = self._bytes[:HEADER_BYTES].view(np.uint64)
            if int(self._words[_W_MAGIC]) != MAGIC or size != HEADER_BYTES + int(self._words[_W_BUDGET]):
                raise RuntimeError(f"gpufeed host cache: the memfd served on \\0{prefix}-K is not a "
                                   f"gpufeed host cache of this version (size {size}). Fix: cache_scope='rank'.")
            # Our own open file description: flock locks belong to descriptions, and a received
            # descriptor shares the sender's.
            self._lock_fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
            self._fork_fds.append(self._lock_fd)
            if self._server is None:
                self._serve(prefix, self._fd)
        except BaseException:
            self.close()
            raise
        self.budget_text = bytes(self._map[_TEXT_AT : _TEXT_AT + _TEXT_BYTES]).rstrip(b"\0").decode()
        if self.budget_text != budget_text:
            warnings.warn(
                f"the host cache of this job was created with cache_bytes={self.budget_text!r} "
                f"({self.budget_bytes} bytes); this loader's cache_bytes={budget_text!r} is not "
                "applied: the job's loaders on a host share one budget. Give every loader of the "
                "job the same cache_bytes, or cache_scope='rank' for a cache of its own.",
                GpufeedWarning, stacklevel=3)
        self._finalizer = weakref.finalize(self, SharedHostCache._release, self.__dict__.copy())

    def _serve(self, prefix: str, fd: int) -> None:
        fds = self._fork_fds
        fds.append(fd)
        self._server = MemberServer(prefix, fd, lambda: list(fds))

    @property
    def budget_bytes(self) -> int:
        """The host budget (bytes), set by the process that created the cache."""
        return int(self._words[_W_BUDGET])

    @property
    def nbytes(self) -> int:
        """Bytes the host's cache holds: reserved for rows and namespace tables (bytes)."""
        return int(self._words[_W_RESERVED])

    @property
    def published_bytes(self) -> int:
        """Bytes of rows published (readable), without tables and alignment (bytes)."""
        return int(self._words[_W_PUBLISHED])

    @property
    def socket_name(self) -> str:
        """The abstract socket name this process serves the cache on (without the NUL)."""
        return self._server.name if self._server is not None else ""

    def _lock(self) -> None:
        self._tlock.acquire()
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._tlock.release()
                    raise TimeoutError(
                        f"gpufeed host cache: its lock stayed taken for {LOCK_TIMEOUT_S:.0f} s (the "
                        f"limit; it is held for microseconds). A process of the job is stopped "
                        f"(SIGSTOP, a debugger) while holding it. Fix: resume it, or cache_scope='rank'."
                    ) from None
                time.sleep(0.0002)

    def _unlock(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._tlock.release()

    def _reserve(self, nbytes: int) -> int | None:
        """(Locked) the data offset of ``nbytes`` new bytes, or None when the budget is spent."""
        words = self._words
        start, size = int(words[_W_RESERVED]), _align(nbytes)
        if start + size > int(words[_W_BUDGET]):
            return None
        words[_W_RESERVED] = start + size
        return start

    def namespace(self, digest: bytes, num_samples: int) -> CacheNamespace | None:
        """The rows of one fingerprint (``digest``, 32 bytes) for sample indices
        0..num_samples-1, made on first use; None when the directory or the budget is full."""
        want = np.frombuffer(digest, np.uint64)
        self._lock()
        try:
            free = None
            for i in range(_DIR_ENTRIES):
                entry = self._words[_DIR_WORD + i * _DIR_WORDS : _DIR_WORD + (i + 1) * _DIR_WORDS]
                if entry[6] == 0:
                    free = i if free is None else free
                elif np.array_equal(entry[:4], want) and int(entry[4]) == num_samples:
                    return CacheNamespace(self, int(entry[5]), num_samples)
            if free is None:
                return None
            offset = self._reserve(8 * num_samples)
            if offset is None:
                return None
            entry = self._words[_DIR_WORD + free * _DIR_WORDS : _DIR_WORD + (free + 1) * _DIR_WORDS]
            entry[:4] = want
            entry[4], entry[5] = num_samples, offset
            entry[6] = 1
            return CacheNamespace(self, offset, num_samples)
        finally:
            self._unlock()

    @staticmethod
    def _release(state: dict[str, Any]) -> None:
        if state.get("_pid") != os.getpid():
            return
        server = state.get("_server")
        if server is not None:
            server.close()
        for name in ("_lock_fd", "_fd"):
            fd = state.get(name, -1)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop serving and close the descriptors (idempotent). Rows already handed out stay
        valid: the mapping goes with the last of them."""
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            finalizer()
        else:
            SharedHostCache._release(self.__dict__)
        self._fd = self._lock_fd = -1
        self._server = None


class CacheNamespace:
    """One loader's view of the host cache: the rows of its fingerprint, keyed by sample index,
    with this loader's hits and misses. The interface of ``HostCache`` (``get_many``, ``peek``,
    ``put``, ``put_row``, ``put_rows``, ``put_bytes``, ``nbytes``, ``budget_bytes``), and
    ``put_many``."""

    shared = True

    def __init__(self, cache: SharedHostCache, table_offset: int, num_samples: int) -> None:
        self.cache = cache
        self.num_samples = num_samples
        self._data = cache._bytes[HEADER_BYTES:]
        self._table = self._data[table_offset : table_offset + 8 * num_samples].view(np.uint64)
        self.hits = 0
        self.misses = 0

    @property
    def budget_bytes(self) -> int:
        return self.cache.budget_bytes

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    def __len__(self) -> int:
        """Rows of this namespace published (by any process)."""
        return int(np.count_nonzero(self._table))

    def _value(self, word: int) -> np.ndarray:
        start = (word >> LENGTH_BITS) * ALIGN
        return self._data[start : start + (word & MAX_VALUE_BYTES)]

    def get_many(self, keys: Sequence[int], count: bool = True) -> list[np.ndarray | None]:
        """The rows of ``keys`` (None: not cached), in order; counted unless ``count=False``.
        Each entry word is loaded once (one gather), and its row is never rewritten."""
        words = self._table[np.asarray(keys, np.int64)].tolist()
        values = [self._value(w) if w else None for w in words]
        if count:
            found = sum(1 for w in words if w)
            self.hits += found
            self.misses += len(words) - found
        return values

    def get(self, key: int) -> np.ndarray | None:
        return self.get_many([key])[0]

    def peek(self, key: int) -> np.ndarray | None:
        return self.get_many([key], count=False)[0]

    def put(self, key: int, value: Any) -> bool:
        """Publish ``value`` (bytes-like or a contiguous array) for ``key`` once: False when
        it was there already, does not fit the budget or is over 256 MiB."""
        return self.put_many([key], [value]) == 1

    def put_many(self, keys: Sequence[int], values: Sequence[Any]) -> int:
        """Publish each of ``values`` for its key of ``keys`` once (as ``put``), with the lock
        taken twice for the whole batch (reserve, then publish); returns how many were
        published by this call."""
        table, cache = self._table, self.cache
        todo = []
        for key, value in zip(keys, values, strict=True):
            if not 0 <= key < self.num_samples:
                raise IndexError(f"gpufeed host cache: sample index {key} outside 0..{self.num_samples - 1}")
            if not table[key]:
                src = (value.reshape(-1).view(np.uint8) if isinstance(value, np.ndarray)
                       else np.frombuffer(value, np.uint8))
                if 0 < src.nbytes <= MAX_VALUE_BYTES:
                    todo.append((key, src))
        if not todo:
            return 0
        placed = []
        cache._lock()
        try:
            for key, src in todo:
                start = None if table[key] else cache._reserve(src.nbytes)
                if start is None:
                    continue  # there already, or the budget is spent (fill-once)
                placed.append((key, src, start))
        finally:
            cache._unlock()
        for _key, src, start in placed:  # no lock held: others fill meanwhile
            np.copyto(self._data[start : start + src.nbytes], src)
        published = 0
        cache._lock()  # (the lock's system call orders the rows' stores before the entries')
        try:
            for key, src, start in placed:
                if table[key]:
                    continue  # another process published it first: these bytes stay unused
                table[key] = (start // ALIGN) << LENGTH_BITS | src.nbytes
                cache._words[_W_PUBLISHED] += np.uint64(src.nbytes)
                published += 1
        finally:
            cache._unlock()
        return published

    def put_rows(self, keys: Sequence[int], rows: Sequence[Any]) -> None:
        """Cache a batch's decoded rows (copied into the cache)."""
        self.put_many(keys, rows)

    def put_row(self, key: int, row: Any) -> None:
        """Cache a decoded row (copied into the cache)."""
        self.put(key, row)

    def put_bytes(self, key: int, data: Any) -> None:
        """Cache encoded bytes (copied into the cache)."""
        self.put(key, data)

    def close(self) -> None:
        self.cache.close()
