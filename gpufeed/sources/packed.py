"""LMDBDataset and pack(): an image folder packed into one LMDB file for fast random reads.

Layout (format "gpufeed-lmdb", version 1), all in the main database:

=================  ========================================================================
key                value
=================  ========================================================================
``0000000000``...  encoded image bytes of sample i (``%010d``), as stored or re-encoded JPEG
``__labels__``     int64 little-endian labels, one per sample
``__paths__``      JSON list of the source paths relative to the packed folder (for messages)
``__gpufeed__``    JSON metadata: format, version, count, classes, max_side, quality;
                   written last, so a pack that did not finish has none
=================  ========================================================================

:func:`pack` writes ``DST.partial`` (with ``gpufeed-pack-job.json``: source, options and a
digest of the file list) under an flock on ``DST.partial.lock``, appending samples in order,
one transaction per ``txn_bytes``; threads read and re-encode ahead of the writer. A rerun of
the same job finds the committed samples (an LMDB transaction is all or nothing, so after a
kill they are exactly ``0..K-1``) and continues at K; at the end the job file goes and the
directory is renamed to DST.

An LMDB environment must not cross ``fork``: each process opens its own, read-only, without
locking or read-ahead, on first read; pickling (for spawn) drops it.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.decode import decode, read_header
from gpufeed.errors import DecodeError, add_note, shorten
from gpufeed.sources._base import DEFAULT_READ_BUDGET_BYTES, DEFAULT_READ_CONCURRENCY, ImageSource
from gpufeed.sources._paths import labels_array
from gpufeed.sources.folder import ImageFolder

logger = logging.getLogger(__name__)

FORMAT = "gpufeed-lmdb"
VERSION = 1
META_KEY = b"__gpufeed__"
LABELS_KEY = b"__labels__"
PATHS_KEY = b"__paths__"


def sample_key(index: int) -> bytes:
    """The LMDB key of sample ``index``."""
    return b"%010d" % index


class LMDBDataset(ImageSource):
    """Images and labels from an LMDB written by :func:`pack` (a directory or a single file).

    ``transform`` and ``target_transform``, ``read_concurrency`` and ``read_budget_bytes``
    (reads in flight per worker): see :class:`~gpufeed.sources.ImageSource`. The default
    ``read_concurrency=None`` is automatic: each worker reads one sample at a time until its
    reads take at least half as long as its decoding, then reads ahead (2 to 64 in flight, from
    the measured latency); an int is kept as given (1: never read ahead).
    """

    def __init__(self, path: str | os.PathLike, transform: Any | None = None,
                 target_transform: Any | None = None, *,
                 read_concurrency: int | None = DEFAULT_READ_CONCURRENCY,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES) -> None:
        self.set_read_options(read_concurrency, read_budget_bytes)
        self.path = os.fspath(path)
        self.transform = transform
        self.target_transform = target_transform
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"LMDB {self.path!r} does not exist; create it with "
                                    f"`gpufeed pack SRC_FOLDER {self.path}`")
        env, temporary = _shared_env(self.path, create=False)
        try:
            with env.begin() as txn:
                raw_meta = txn.get(META_KEY)
                raw_labels = txn.get(LABELS_KEY)
        finally:
            if temporary:
                env.close()
        if raw_meta is None or raw_labels is None:
            raise ValueError(f"{self.path!r} is not a complete gpufeed LMDB (no {META_KEY!r} "
                             f"record): was `gpufeed pack` interrupted? Pack it again.")
        meta = json.loads(raw_meta)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"{self.path!r} has format {meta.get('format')!r} version "
                             f"{meta.get('version')!r}; this gpufeed reads {FORMAT!r} version "
                             f"{VERSION}. Pack it again with this version.")
        self.meta = meta
        self.classes = list(meta["classes"])
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self._labels = labels_array(np.frombuffer(raw_labels, dtype="<i8"))
        if len(self._labels) != meta["count"]:
            raise ValueError(f"{self.path!r}: {len(self._labels)} labels for {meta['count']} "
                             f"samples: corrupt file. Pack it again.")
        self._paths: list[str] | None = None

    def _environment(self) -> Any:
        return _shared_env(self.path)[0]

    def __len__(self) -> int:
        return len(self._labels)

    def read(self, index: int) -> bytes:
        key = sample_key(index)
        with self._environment().begin() as txn:
            value = txn.get(key)
        if value is None:
            raise OSError(f"LMDB {self.path!r} has no record {key.decode()}: incomplete or not "
                          f"written by gpufeed pack. Pack it again.")
        return value

    def label(self, index: int) -> int:
        return int(self._labels[index])

    def describe(self, index: int) -> str:
        where = f"lmdb:{sample_key(index).decode()} in {self.path}"
        if self._paths is None:
            try:
                with self._environment().begin() as txn:
                    raw = txn.get(PATHS_KEY)
                self._paths = json.loads(raw) if raw else []
            except (OSError, ValueError):
                self._paths = []
        if 0 <= index < len(self._paths):
            where += f" (packed from {self._paths[index]})"
        return where

    @property
    def labels(self) -> np.ndarray:
        """All labels, int64 (read-only)."""
        return self._labels

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_paths"] = None
        return state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(path={self.path!r}, {len(self)} images, "
                f"{len(self.classes)} classes, transform={self.transform!r})")


# One read-only environment per LMDB path and process: LMDB refuses to open the same file
# twice in a process, and an environment must not be used across fork. realpath -> (pid, env).
_envs: dict[str, tuple[int, Any]] = {}
_envs_lock = threading.Lock()  # read threads (read_concurrency) open the environment together
os.register_at_fork(after_in_child=lambda: globals().update(_envs_lock=threading.Lock()))


def _shared_env(path: str, create: bool = True) -> tuple[Any, bool]:
    """(environment, temporary) for ``path`` in this process. With ``create``, a new environment
    is cached for later reads; without, one that is not yet cached is returned as temporary
    (the caller closes it), so that merely constructing a dataset leaves nothing open."""
    with _envs_lock:
        return _shared_env_locked(path, create)


def _shared_env_locked(path: str, create: bool) -> tuple[Any, bool]:
    import lmdb

    key = os.path.realpath(path)
    pid = os.getpid()
    entry = _envs.get(key)
    if entry is not None and entry[0] == pid:
        return entry[1], False
    if entry is not None:
        # Inherited through fork: close this process's copy of the parent's mapping (the
        # parent's stays open), since LMDB will not open the file again while it is registered.
        del _envs[key]
        try:
            entry[1].close()
        except lmdb.Error:
            pass
    env = lmdb.open(path, subdir=os.path.isdir(path), readonly=True, lock=False,
                    readahead=False, meminit=False, max_readers=2048)
    if create:
        _envs[key] = (pid, env)
    return env, not create


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote: sample count, bytes read and written, re-encoded count and
    seconds (of this run), and the sample index it resumed from (0: a fresh pack)."""

    path: str
    count: int
    classes: tuple[str, ...]
    bytes_read: int
    bytes_written: int
    reencoded: int
    seconds: float
    resumed_from: int = 0


JOB_FILE = "gpufeed-pack-job.json"  # inside the partial LMDB directory, removed when complete
#: Most threads a pack uses by default (fewer on a machine with fewer cores): reads wait on
#: storage, but re-encoding is CPU-bound (on 2 busy cores 8 threads re-encoded no faster than 1).
MAX_DEFAULT_PACK_WORKERS = 8


def pack(src_folder: str | os.PathLike, dst_lmdb: str | os.PathLike, *,
         max_side: int | None = None, quality: int | None = None, progress: bool = True,
         txn_bytes: int = 64 << 20, workers: int | None = None) -> PackResult:
    """Pack an image folder (torchvision ``ImageFolder`` layout and order) into a new LMDB.

    ``max_side`` (pixels): images whose longer side exceeds it are downscaled to it (DCT-scaled
    decode, then INTER_AREA) and re-encoded as JPEG. ``quality`` (1-100): re-encode every image
    as JPEG at this quality (default 90 for the downscaled ones). Otherwise the original bytes are
    stored unchanged, after a header check that rejects empty and non-image files
    (:class:`~gpufeed.errors.DecodeError` naming the file). ``txn_bytes`` bounds one write
    transaction. ``workers``: threads reading and preparing images ahead of the writer (file
    reads, libjpeg and OpenCV release the GIL; default: the CPU count, at most 8); samples are
    written in order.
    ``progress``: a tqdm bar if tqdm is installed, else a log line every 5 s.

    The LMDB is written as ``DST.partial`` and renamed to ``dst_lmdb`` when complete. A pack
    that stops early (killed, interrupted, or a file it cannot read) keeps what it committed:
    running the same pack again resumes after the last committed sample, and the result has the
    same content as an uninterrupted pack. A partial pack of another source, list of files or
    options is replaced (with a warning); delete ``DST.partial`` to start over.
    """
    import lmdb

    if max_side is not None and (isinstance(max_side, bool) or not isinstance(max_side, int)
                                 or max_side <= 0):
        raise ValueError(f"`max_side` must be None or an int > 0. Found: {shorten(max_side)}.")
    if quality is not None and (isinstance(quality, bool) or not isinstance(quality, int)
                                or not 1 <= quality <= 100):
        raise ValueError(f"`quality` must be None or an int in 1..100. Found: {shorten(quality)}.")
    if txn_bytes <= 0:
        raise ValueError(f"`txn_bytes` must be > 0. Found: {shorten(txn_bytes)}.")
    if workers is None:
        workers = min(MAX_DEFAULT_PACK_WORKERS, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"`workers` must be an int >= 1. Found: {shorten(workers)}.")
    dst = os.fspath(dst_lmdb)
    if os.path.exists(dst):
        raise FileExistsError(f"{dst!r} already exists; pass a new path or delete it first")
    folder = ImageFolder(src_folder)
    n = len(folder)
    partial = f"{dst}.partial"
    job = {"format": FORMAT, "version": VERSION, "src": os.path.abspath(folder.root),
           "count": n, "classes": folder.classes, "max_side": max_side, "quality": quality,
           "paths": hashlib.blake2b(np.asarray(folder._paths.blob).tobytes()
                                    + np.asarray(folder.labels).tobytes()).hexdigest()}
    lock_fd = _lock(partial)
    start = time.perf_counter()
    try:
        first = _resume_point(partial, job)
        if first == 0:
            _remove_tree(partial)
            os.mkdir(partial)
            with open(os.path.join(partial, JOB_FILE), "w") as f:
                json.dump(job, f)
        guess = _estimated_bytes(folder)
        env = lmdb.open(partial, map_size=_round_map_size(guess * 1.25 + (32 << 20)),
                        subdir=True, meminit=False, max_dbs=0)
        try:
            read, written, reencoded = _write_samples(env, folder, first, max_side, quality,
                                                      txn_bytes, workers, progress, dst)
            meta = {"format": FORMAT, "version": VERSION, "count": n,
                    "classes": folder.classes, "max_side": max_side, "quality": quality}
            paths = [os.path.relpath(folder.path(i), folder.root) for i in range(n)]
            _put_all(env, [(LABELS_KEY, folder.labels.astype("<i8").tobytes()),
                           (PATHS_KEY, json.dumps(paths).encode()),
                           (META_KEY, json.dumps(meta).encode())], append=False)
            env.sync(True)
        finally:
            env.close()
        os.unlink(os.path.join(partial, JOB_FILE))
        os.rename(partial, dst)
    finally:
        _unlock(partial, lock_fd)
    seconds = time.perf_counter() - start
    logger.debug("packed %d images (%d re-encoded, from %d on) from %s into %s: %.1f MB -> "
                 "%.1f MB in %.1f s", n, reencoded, first, folder.root, dst, read / 1e6,
                 written / 1e6, seconds)
    return PackResult(dst, n, tuple(folder.classes), read, written, reencoded, seconds, first)


def _write_samples(env: Any, folder: Any, first: int, max_side: int | None,
                   quality: int | None, txn_bytes: int, workers: int, progress: bool,
                   dst: str) -> tuple[int, int, int]:
    """Read, prepare (on ``workers`` threads, a bounded window ahead) and append samples
    ``first..len(folder)-1`` in order, one transaction per ``txn_bytes``; on any failure the
    samples before it are committed and the error says how to resume. Returns (bytes read,
    bytes written, re-encoded count)."""
    from concurrent.futures import ThreadPoolExecutor

    import lmdb

    n = len(folder)
    bar = _Progress(n, dst, progress, done=first)
    read = written = reencoded = 0
    batch: list[tuple[bytes, bytes]] = []
    batch_bytes = 0
    window: collections.deque = collections.deque()
    pending = iter(range(first, n))
    ex = ThreadPoolExecutor(workers, thread_name_prefix="gpufeed-pack")
    i = committed = first
    try:
        for j in itertools.islice(pending, 4 * workers):
            window.append(ex.submit(_load_one, folder.path(j), max_side, quality))
        while window:
            try:
                size, value, changed = window.popleft().result()
            except DecodeError as exc:
                raise DecodeError(f"cannot pack {folder.path(i)} (sample index {i}): {exc}. "
                                  f"Remove or replace the file and run the same pack again: "
                                  f"it resumes at this sample.") from exc
            nxt = next(pending, None)
            if nxt is not None:
                window.append(ex.submit(_load_one, folder.path(nxt), max_side, quality))
            batch.append((sample_key(i), value))
            batch_bytes += len(value)
            read, written, reencoded = read + size, written + len(value), reencoded + changed
            bar.update(size)
            i += 1
            if batch_bytes >= txn_bytes or len(batch) >= 10000:
                _put_all(env, batch, append=True)
                batch, batch_bytes, committed = [], 0, i
        if batch:
            _put_all(env, batch, append=True)
            batch, committed = [], i
    except BaseException as exc:
        ex.shutdown(wait=True, cancel_futures=True)
        if batch:
            try:
                _put_all(env, batch, append=True)  # keep everything before the failure
                committed = i
            except (OSError, lmdb.Error):
                pass  # (the failure was the write itself)
        add_note(exc, f"gpufeed pack: samples 0..{committed - 1} of {n} are committed in "
                      f"{dst}.partial; run the same pack again to resume at sample {committed}")
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return read, written, reencoded


def _load_one(path: str, max_side: int | None, quality: int | None) -> tuple[int, bytes, bool]:
    """(bytes read, bytes to store, re-encoded) for one image file (runs on a pack thread)."""
    with open(path, "rb") as f:
        data = f.read()
    value, changed = _prepare(data, max_side, quality)
    return len(data), value, changed


def _resume_point(partial: str, job: dict[str, Any]) -> int:
    """How many samples ``partial`` holds for ``job`` (0 when there is none, or it is another
    job's, which is then discarded with a warning)."""
    if not os.path.exists(partial):
        return 0
    import lmdb

    try:
        with open(os.path.join(partial, JOB_FILE)) as f:
            found = json.load(f)
        env = lmdb.open(partial, subdir=True, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                entries = int(txn.stat()["entries"])
                complete = (entries == 0 or (txn.get(sample_key(entries - 1)) is not None
                                             and txn.get(sample_key(entries)) is None))
        finally:
            env.close()
    except (OSError, ValueError, lmdb.Error) as exc:
        found, entries, complete = {"unreadable": str(exc)}, 0, False
    if found != job or not complete:
        warnings.warn(f"{partial!r} holds a partial pack of another source, file list or "
                      f"options (or is damaged); starting over", RuntimeWarning, stacklevel=3)
        return 0
    logger.info("pack: resuming %s at sample %d of %d", partial, entries, job["count"])
    return entries


def _lock(partial: str) -> int:
    """Hold ``PARTIAL.lock`` (flock), so two packs never write one partial LMDB."""
    import fcntl

    fd = os.open(partial + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"another gpufeed pack is writing {partial!r} (it holds "
                           f"{partial}.lock); wait for it, or stop it first") from None
    return fd


def _unlock(partial: str, fd: int) -> None:
    """Release the lock; the lock file goes once the pack is complete."""
    if not os.path.exists(partial):
        try:
            os.unlink(partial + ".lock")
        except OSError:
            pass
    os.close(fd)


def _estimated_bytes(folder: Any, samples: int = 1000) -> int:
    """Total file bytes, estimated from up to ``samples`` files spread over the folder (one
    ``stat`` per file would take 15 s at 1.28M files; the map grows if this is short)."""
    n = len(folder)
    if n == 0:
        return 0
    picks = np.linspace(0, n - 1, min(n, samples)).astype(np.int64)
    sizes = [os.path.getsize(folder.path(int(i))) for i in picks]
    return int(sum(sizes) / len(sizes) * n)


def _prepare(data: bytes, max_side: int | None, quality: int | None) -> tuple[bytes, bool]:
    """The bytes to store for one image, and whether they were re-encoded."""
    header = read_header(data)
    longest = max(header.height, header.width)
    shrink_to = max_side if max_side is not None and longest > max_side else None
    if shrink_to is None and quality is None:
        return data, False
    import cv2

    if shrink_to is not None:
        s = shrink_to / longest
        th, tw = max(1, round(header.height * s)), max(1, round(header.width * s))
        img = decode(data, min_height=th, min_width=tw, header=header)
        if img.shape[:2] != (th, tw):
            img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
    else:
        img = decode(data, header=header)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, 90 if quality is None else quality])
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {img.shape} image as JPEG")
    return buf.tobytes(), True


def _put_all(env: Any, items: list[tuple[bytes, bytes]], *, append: bool) -> None:
    """Write ``items`` in one transaction, doubling the map size while it is full."""
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in items:
                    txn.put(key, value, append=append)
            return
        except lmdb.MapFullError:
            size = env.info()["map_size"] * 2
            logger.debug("LMDB map full; growing it to %d bytes", size)
            env.set_mapsize(size)


def _round_map_size(nbytes: float) -> int:
    mib = 1 << 20
    return int(-(-int(nbytes) // mib) * mib)


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


class _Progress:
    """A tqdm bar when available and wanted, else a log line every 5 s (or nothing)."""

    def __init__(self, total: int, name: str, enabled: bool, done: int = 0) -> None:
        self.total, self.done, self.nbytes = total, done, 0
        self.start = self.last = time.perf_counter()
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, initial=done, unit="img",
                                desc=f"pack {os.path.basename(name)}")

    def update(self, nbytes: int) -> None:
        self.done += 1
        self.nbytes += nbytes
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            now = time.perf_counter()
            if now - self.last >= 5.0 or self.done == self.total:
                self.last = now
                rate = self.nbytes / max(now - self.start, 1e-9) / 1e6
                logger.info("pack: %d/%d images (%.0f%%), %.1f MB/s read", self.done, self.total,
                            100.0 * self.done / max(self.total, 1), rate)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
