"""pack(): an image folder into a new LMDB (the format of :mod:`gpufeed.sources._packed`).

Writing: ``DST.partial`` (a directory) under an flock on ``DST.partial.lock``, holding
``gpufeed-pack-job.json`` (source, classes, options) and ``gpufeed-pack-files.npz`` (the
source's file list and labels when this run began). Threads read, check and re-encode ahead of
the writer; samples are appended in order, one transaction per ``txn_bytes``, and each
transaction also writes the progress record ``!pack-progress``: the source index of the next
file and the source indices left out before it (``on_error="skip"``). An LMDB transaction is all
or nothing, so after a kill the record and the samples agree.

Resuming: a rerun with the same source, classes and options whose first ``next`` files (paths
and labels) are the ones already packed continues at ``next``; the files after it may have
changed (a bad file replaced or deleted). Anything else starts over, with a warning saying why.
At the end the progress record goes, the labels, paths and metadata are written, and the
directory is renamed to DST.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufeed._progress import ProgressBar
from gpufeed.decoders import decode, read_header
from gpufeed.errors import DecodeError, GpufeedWarning, add_note, check_int, shorten
from gpufeed.sources._folder import ImageFolder
from gpufeed.sources._packed import FORMAT, LABELS_KEY, META_KEY, PATHS_KEY, VERSION, sample_key
from gpufeed.sources._verify import check_on_error, skip_or_raise, verify_image

logger = logging.getLogger("gpufeed.sources._packed")

# Only in a partial pack; it sorts before the sample keys (digits), so that they stay appendable.
PROGRESS_KEY = b"!pack-progress"
JOB_FILE = "gpufeed-pack-job.json"  # inside the partial LMDB directory, removed when complete
FILES_FILE = "gpufeed-pack-files.npz"  # likewise: the file list the committed samples came from
WRITER = 2  # the partial layout above; a partial of another layout starts over
#: Most threads a pack uses by default (fewer on a machine with fewer cores): reads wait on
#: storage, but re-encoding is CPU-bound (on 2 busy cores 8 threads re-encoded no faster than 1).
MAX_DEFAULT_PACK_WORKERS = 8
LOGGED_SKIPS = 20  # skipped files named one by one in the log; the rest are counted


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote: ``count`` samples, bytes read and written, re-encoded count and
    seconds (of this run), the sample index it resumed from (0: a fresh pack), the files left
    out (``skipped``: paths relative to the source, every run of this pack) and whether images
    were checked by a decode (``verified``)."""

    path: str
    count: int
    classes: tuple[str, ...]
    bytes_read: int
    bytes_written: int
    reencoded: int
    seconds: float
    resumed_from: int = 0
    skipped: tuple[str, ...] = ()
    verified: bool = True


@dataclass
class _Position:
    """Where a pack stands: ``next``, the source index of the next file; ``skipped``, the
    source indices left out before it."""

    next: int = 0
    skipped: list[int] = field(default_factory=list)

    @property
    def written(self) -> int:
        """Samples in the LMDB (keys ``0..written-1``)."""
        return self.next - len(self.skipped)

    def record(self) -> tuple[bytes, bytes]:
        return PROGRESS_KEY, json.dumps({"next": self.next, "skipped": self.skipped}).encode()


def pack(src_folder: str | os.PathLike, dst_lmdb: str | os.PathLike, *,
         max_side: int | None = None, quality: int | None = None, progress: bool = True,
         txn_bytes: int = 64 << 20, workers: int | None = None, verify: bool = True,
         on_error: str = "raise") -> PackResult:
    """Pack an image folder (torchvision ``ImageFolder`` layout and order) into a new LMDB.

    ``max_side`` (pixels): images whose longer side exceeds it are downscaled to it (DCT-scaled
    decode, then INTER_AREA) and re-encoded as JPEG. ``quality`` (1-100): re-encode every image
    as JPEG at this quality (default 90 for the downscaled ones). Otherwise the original bytes are
    stored unchanged, after a check: with ``verify`` (default) a reduced-scale decode
    (:func:`gpufeed.sources._verify.verify_image`) that catches truncated and corrupt files,
    else a header check that catches only empty and non-image files. A file that fails is
    refused, ``on_error="raise"`` (:class:`~gpufeed.errors.DecodeError` naming the file and
    its sample index), or left out and counted, ``on_error="skip"`` (``PackResult.skipped``).
    ``txn_bytes`` bounds one write transaction. ``workers``: threads reading and preparing
    images ahead of the writer (file reads, libjpeg and OpenCV release the GIL; default: the CPU
    count, at most 8); samples are written in order.
    ``progress``: a bar on stderr when it is a terminal (tqdm if installed), else a log line
    every 5 s.

    The LMDB is written as ``DST.partial`` and renamed to ``dst_lmdb`` when complete. A pack
    that stops early (killed, interrupted, or a file it refuses) keeps what it committed:
    running the same pack again resumes after the last committed sample, also when the refused
    file was replaced or deleted, and the result has the same content as an uninterrupted pack.
    A partial pack of another source, other options or other files before that sample is
    replaced (with a warning saying why); delete ``DST.partial`` to start over.
    """
    import lmdb

    if max_side is not None:
        check_int("max_side", max_side, 1, kind="None or an int", rule="> 0")
    if quality is not None:
        check_int("quality", quality, 1, 100, kind="None or an int", rule="in 1..100")
    if txn_bytes <= 0:
        raise ValueError(f"`txn_bytes` must be > 0. Found: {shorten(txn_bytes)}.")
    if workers is None:
        workers = min(MAX_DEFAULT_PACK_WORKERS, os.cpu_count() or 1)
    check_int("workers", workers, 1)
    check_on_error(on_error)
    dst = os.fspath(dst_lmdb)
    if os.path.exists(dst):
        raise FileExistsError(f"{dst!r} already exists; pass a new path or delete it first")
    folder = ImageFolder(src_folder)
    n = len(folder)
    partial = f"{dst}.partial"
    job = {"format": FORMAT, "version": VERSION, "writer": WRITER,
           "src": os.path.abspath(folder.root), "classes": folder.classes,
           "max_side": max_side, "quality": quality}
    lock_fd = _lock(partial)
    start = time.perf_counter()
    try:
        position = _resume_point(partial, job, folder)
        first = 0 if position is None else position.next
        if position is None:
            position = _Position()
            _remove_tree(partial)
            os.mkdir(partial)
            with open(os.path.join(partial, JOB_FILE), "w") as f:
                json.dump(job, f)
        _save_files(partial, folder)  # the list this run packs: a rerun compares against it
        guess = _estimated_bytes(folder)
        env = lmdb.open(partial, map_size=_round_map_size(guess * 1.25 + (32 << 20)),
                        subdir=True, meminit=False, max_dbs=0)
        try:
            read, written, reencoded = _write_samples(
                env, folder, position, _Options(max_side, quality, verify, on_error),
                txn_bytes, workers, progress, dst)
            skipped = _finish(env, folder, position.skipped, job)
        finally:
            env.close()
        for name in (JOB_FILE, FILES_FILE):
            os.unlink(os.path.join(partial, name))
        os.rename(partial, dst)
    finally:
        _unlock(partial, lock_fd)
    seconds = time.perf_counter() - start
    logger.debug("packed %d images (%d re-encoded, %d skipped, from %d on) from %s into %s: "
                 "%.1f MB -> %.1f MB in %.1f s", n - len(skipped), reencoded, len(skipped), first,
                 folder.root, dst, read / 1e6, written / 1e6, seconds)
    return PackResult(dst, n - len(skipped), tuple(folder.classes), read, written, reencoded,
                      seconds, first, tuple(skipped), bool(verify))


@dataclass(frozen=True)
class _Options:
    max_side: int | None
    quality: int | None
    verify: bool
    on_error: str


def _finish(env: Any, folder: Any, skipped: list[int], job: dict[str, Any]) -> list[str]:
    """Write labels, paths and metadata of the samples kept, drop the progress record (one
    transaction); returns the skipped files' paths relative to the source."""
    n = len(folder)
    kept = np.ones(n, dtype=bool)
    kept[np.asarray(skipped, dtype=np.int64)] = False
    relative = [os.path.relpath(folder.path(i), folder.root) for i in range(n)]
    paths = [p for p, keep in zip(relative, kept) if keep]
    left_out = [relative[i] for i in skipped]
    meta = {"format": FORMAT, "version": VERSION, "count": len(paths),
            "classes": folder.classes, "max_side": job["max_side"], "quality": job["quality"],
            "skipped": left_out}
    _put_all(env, [(LABELS_KEY, np.asarray(folder.labels)[kept].astype("<i8").tobytes()),
                   (PATHS_KEY, json.dumps(paths).encode()),
                   (META_KEY, json.dumps(meta).encode())], append=False, delete=[PROGRESS_KEY])
    env.sync(True)
    return left_out


def _write_samples(env: Any, folder: Any, position: _Position, options: _Options,
                   txn_bytes: int, workers: int, progress: bool,
                   dst: str) -> tuple[int, int, int]:
    """Read, check and prepare (on ``workers`` threads, a bounded window ahead) and append the
    samples from ``position`` on, in order, one transaction per ``txn_bytes`` (each with the
    progress record); ``position.skipped`` grows with the files left out. On any failure what
    came before it is committed and a note says where a rerun resumes. Returns (bytes read,
    bytes written, re-encoded count)."""
    from concurrent.futures import ThreadPoolExecutor

    import lmdb

    n = len(folder)
    bar = _PackProgress(n, dst, progress, done=position.next)
    read = written = reencoded = 0
    batch: list[tuple[bytes, bytes]] = []
    batch_bytes = 0
    window: collections.deque = collections.deque()
    pending = iter(range(position.next, n))
    ex = ThreadPoolExecutor(workers, thread_name_prefix="gpufeed-pack")
    committed = _Position(position.next, list(position.skipped))
    i, k = position.next, position.written  # next source index, next sample key

    def submit(j: int) -> None:
        window.append(ex.submit(_load_one, folder.path(j), options))

    def commit() -> None:
        nonlocal batch, batch_bytes, committed
        position.next = i
        _put_all(env, batch, append=True, records=[position.record()])
        batch, batch_bytes, committed = [], 0, _Position(i, list(position.skipped))

    try:
        for j in itertools.islice(pending, 4 * workers):
            submit(j)
        while window:
            future = window.popleft()
            nxt = next(pending, None)
            if nxt is not None:
                submit(nxt)
            try:
                size, value, changed = future.result()
            except DecodeError as exc:
                reason = skip_or_raise(exc, folder.path(i), i, options.on_error)
                position.skipped.append(i)
                if len(position.skipped) <= LOGGED_SKIPS:
                    logger.warning("pack: skipped %s", reason)
                elif len(position.skipped) == LOGGED_SKIPS + 1:
                    logger.warning("pack: more files skipped; the count is given at the end")
                i += 1
                bar.update(0)
                continue
            batch.append((sample_key(k), value))
            batch_bytes += len(value)
            read, written, reencoded = read + size, written + len(value), reencoded + changed
            bar.update(size)
            i, k = i + 1, k + 1
            if batch_bytes >= txn_bytes or len(batch) >= 10000:
                commit()
        if batch or committed.next != i:
            commit()
    except BaseException as exc:
        ex.shutdown(wait=True, cancel_futures=True)
        if batch or committed.next != i:
            try:
                commit()  # keep everything before the failure
            except (OSError, lmdb.Error):
                pass  # (the failure was the write itself)
        left = f", {len(committed.skipped)} skipped" if committed.skipped else ""
        add_note(exc, f"gpufeed pack: the first {committed.next} of {n} files are done in "
                      f"{dst}.partial ({committed.written} packed{left}); run the same pack "
                      f"again to resume at sample {committed.next}")
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return read, written, reencoded


def _load_one(path: str, options: _Options) -> tuple[int, bytes, bool]:
    """(bytes read, bytes to store, re-encoded) for one image file (runs on a pack thread).
    A re-encoded image was decoded whole; one stored as is is decoded at reduced scale when
    ``options.verify``."""
    with open(path, "rb") as f:
        data = f.read()
    value, changed = _prepare(data, options.max_side, options.quality)
    if options.verify and not changed:
        verify_image(data)
    return len(data), value, changed


def _save_files(partial: str, folder: Any) -> None:
    """The source's file list and labels into ``partial`` (written aside, then renamed: a kill
    leaves the old list or the new one, never half of one)."""
    table = folder._paths
    aside = os.path.join(partial, "new-" + FILES_FILE)
    np.savez(aside, blob=np.asarray(table.blob), offsets=np.asarray(table.offsets),
             labels=np.asarray(folder.labels))
    os.replace(aside, os.path.join(partial, FILES_FILE))


def _resume_point(partial: str, job: dict[str, Any], folder: Any) -> _Position | None:
    """Where ``partial`` resumes for ``job`` over ``folder``; None when there is no partial
    pack, or one that cannot continue (then replaced, with a warning saying why)."""
    if not os.path.exists(partial):
        return None
    import lmdb

    try:
        with open(os.path.join(partial, JOB_FILE)) as f:
            found = json.load(f)
        with np.load(os.path.join(partial, FILES_FILE)) as files:
            old = (files["blob"], files["offsets"], files["labels"])
        env = lmdb.open(partial, subdir=True, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                raw = txn.get(PROGRESS_KEY)
                position = _Position() if raw is None else _Position(**json.loads(raw))
                k = position.written
                agree = ((k == 0 or txn.get(sample_key(k - 1)) is not None)
                         and txn.get(sample_key(k)) is None)
        finally:
            env.close()
    except (OSError, ValueError, KeyError, TypeError, lmdb.Error) as exc:
        why: str | None = f"it cannot be read ({type(exc).__name__}: {exc})"
    else:
        why = _job_change(found, job) or _files_change(old, folder, position.next)
        if why is None and not agree:
            why = "its progress record and its samples disagree (damaged)"
    if why is not None:
        warnings.warn(f"gpufeed pack: starting {partial} over: {why}", GpufeedWarning,
                      stacklevel=3)
        return None
    logger.info("pack: resuming %s at sample %d of %d", partial, position.next, len(folder))
    return position


def _job_change(found: dict[str, Any], job: dict[str, Any]) -> str | None:
    """What differs between the partial pack's job and this one (None: nothing)."""
    names = {"writer": "layout (written by another gpufeed version)", "format": "format",
             "version": "format version", "src": "source folder", "classes": "list of classes",
             "max_side": "--max-side", "quality": "--quality"}
    for key, name in names.items():
        if found.get(key) != job[key]:
            if key == "classes":
                return "it packs another list of classes"
            return f"it packs another {name} ({found.get(key)!r}; now {job[key]!r})"
    return None


def _files_change(old: tuple[np.ndarray, np.ndarray, np.ndarray], folder: Any,
                  done: int) -> str | None:
    """Why the first ``done`` files of ``folder`` are not those of ``old`` (blob, offsets,
    labels), or None when they are (later files may differ)."""
    blob, offsets, labels = old
    table = folder._paths
    new_blob, new_offsets = np.asarray(table.blob), np.asarray(table.offsets)
    if len(new_offsets) <= done:
        return f"it holds {done} files and the source now has {len(new_offsets) - 1}"
    same = (len(offsets) > done and np.array_equal(offsets[:done + 1], new_offsets[:done + 1])
            and np.array_equal(blob[:offsets[done]], new_blob[:new_offsets[done]])
            and np.array_equal(labels[:done], np.asarray(folder.labels)[:done]))
    return None if same else f"files among the first {done} (already packed) changed"


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


def _put_all(env: Any, items: list[tuple[bytes, bytes]], *, append: bool,
             records: list[tuple[bytes, bytes]] | tuple = (),
             delete: list[bytes] | tuple = ()) -> None:
    """Write ``items`` (appended when ``append``: keys in order, after every key there), then
    ``records`` (put anywhere), and delete ``delete``, in one transaction, doubling the map
    size while it is full."""
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in items:
                    if not txn.put(key, value, append=append):
                        raise RuntimeError(f"LMDB refused to {'append' if append else 'put'} key "
                                           f"{key!r} (out of order or present): a bug in pack")
                for key, value in records:
                    txn.put(key, value)
                for key in delete:
                    txn.delete(key)
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


class _PackProgress:
    """A bar on a terminal (:class:`~gpufeed._progress.ProgressBar`), else a log line
    every 5 s (or nothing when not ``enabled``)."""

    def __init__(self, total: int, name: str, enabled: bool, done: int = 0) -> None:
        self.total, self.done, self.nbytes = total, done, 0
        self.start = self.last = time.perf_counter()
        self.bar = ProgressBar(total, enabled, f"pack {os.path.basename(name)}", unit="img",
                               initial=done)
        self.log = enabled and not self.bar.drawn

    def update(self, nbytes: int) -> None:
        self.done += 1
        self.nbytes += nbytes
        self.bar.done()
        if self.log:
            now = time.perf_counter()
            if now - self.last >= 5.0:
                self.last = now
                rate = self.nbytes / max(now - self.start, 1e-9) / 1e6
                logger.info("pack: %d/%d images (%.0f%%), %.1f MB/s read", self.done, self.total,
                            100.0 * self.done / max(self.total, 1), rate)

    def close(self) -> None:
        self.bar.close()
