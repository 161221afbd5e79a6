"""pack_tar(): an image dataset or folder written as WebDataset tar shards with sidecars.

Each sample ``i`` becomes two members, ``%09d.EXT`` (the image: the source file's extension,
or one from its bytes) and ``%09d.cls`` (its label as decimal text), in sample order. A shard
is closed once it holds ``shard_bytes`` or more (so shards are ``shard_bytes`` plus at most one
sample) or ``max_samples`` samples. Shards are plain tar files (``tarfile``'s pax format, fixed
mtime 0, mode 0444, owner gpufeed): webdataset, ``tar`` and :class:`TarShards` read them.

Shard ``k`` is written as ``DST/PREFIX-%06d.tar.partial``, flushed to disk, renamed to
``PREFIX-%06d.tar``, then its sidecar index ``PREFIX-%06d.tar.idx`` is written (atomically);
a shard counts as done once its sidecar is there. ``DST/gpufeed-pack-job.json`` (source,
options, a digest of the sample list) marks a pack in progress: a rerun of the same job keeps
the done shards and continues with the next, so the result is the same as an uninterrupted
pack; a job file of another job is an error (delete DST or pass another one). The job file goes
when the pack completes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import DecodeError, add_note, check_int, shorten
from gpufeed.sources._folder import ImageFolder
from gpufeed.sources._npz import write_npz
from gpufeed.sources._pack import MAX_DEFAULT_PACK_WORKERS, _PackProgress, _prepare
from gpufeed.sources._tar_cache import SIDECAR_SUFFIX, read_sidecar, sidecar_arrays
from gpufeed.sources._tar_walk import local_reader, walk
from gpufeed.sources._verify import check_on_error, skip_or_raise, verify_image

logger = logging.getLogger(__name__)

JOB_FILE = "gpufeed-pack-job.json"
DEFAULT_SHARD_BYTES = 256 << 20
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG", "png"), (b"BM", "bmp"), (b"GIF8", "gif"))


@dataclass(frozen=True)
class TarPackResult:
    """What :func:`pack_tar` wrote: the shard paths, samples of the source, bytes of image
    data read and written, re-encoded count, seconds (this run), the shard it resumed at (0:
    fresh), whether images were decoded to check them, and (this run) the samples left out with
    ``on_error="skip"``: "DESCRIPTION (sample index I): why"."""

    shards: tuple[str, ...]
    count: int
    bytes_read: int
    bytes_written: int
    reencoded: int
    seconds: float
    resumed_from_shard: int = 0
    verified: bool = True
    skipped: tuple[str, ...] = ()


def image_extension(data: bytes, path: str | None) -> str:
    """The member extension for an image: its file's (lower-cased), else from its bytes."""
    if path is not None:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext:
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((ext for magic, ext in _MAGIC if data.startswith(magic)), "bin")


def pack_tar(src: Any, dst: str | os.PathLike, *, shard_bytes: int = DEFAULT_SHARD_BYTES,
             max_samples: int | None = None, prefix: str = "shard",
             max_side: int | None = None, quality: int | None = None,
             workers: int | None = None, progress: bool = True, verify: bool = True,
             on_error: str = "raise") -> TarPackResult:
    """Write ``src`` (an image folder path, or any gpufeed image dataset: ``ImageFolder``,
    ``LMDBDataset``, ``TarShards``...) as tar shards into the directory ``dst``.

    ``shard_bytes``: target shard size (bytes); ``max_samples``: at most this many samples per
    shard. ``max_side``/``quality``: as for :func:`gpufeed.pack` (downscale, re-encode as JPEG).
    ``verify``: decode every image stored as is at reduced scale, as :func:`gpufeed.pack` does
    (False: a header check only); a file that fails is a :class:`~gpufeed.errors.DecodeError`
    naming it with ``on_error="raise"``, left out (its key is then missing) and listed in
    ``skipped`` with ``"skip"``. ``workers``: threads reading and preparing images ahead of the
    writer. See the module docstring for the layout and resuming.
    """
    check_int("shard_bytes", shard_bytes, 1)
    if max_samples is not None:
        check_int("max_samples", max_samples, 1, kind="None or an int")
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise ValueError(f"`prefix` must be a non-empty file name prefix. Found: {shorten(prefix)}.")
    workers = min(MAX_DEFAULT_PACK_WORKERS, os.cpu_count() or 1) if workers is None else workers
    check_int("workers", workers, 1)
    check_on_error(on_error)
    dataset = ImageFolder(src) if isinstance(src, (str, os.PathLike)) else src
    out_dir = os.fspath(dst)
    job = _job(dataset, src, shard_bytes, max_samples, prefix, max_side, quality)
    job.update(verify=bool(verify), on_error=on_error)
    start = time.perf_counter()
    done_shards, first = _resume(out_dir, prefix, job)
    writer = _ShardWriter(out_dir, prefix, len(done_shards), shard_bytes, max_samples)
    bar = _PackProgress(len(dataset), os.path.join(out_dir, prefix), progress, done=first)
    read = reencoded = 0
    skipped: list[str] = []
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="gpufeed-pack") as ex:
            for i, item in _prepared(ex, dataset, first, workers, max_side, quality, verify,
                                     on_error):
                if isinstance(item, str):
                    skipped.append(item)
                    logger.warning("pack: skipping %s", item)
                    bar.update(0)
                    continue
                size, data, changed = item
                writer.add(i, data, image_extension(data, _path_of(dataset, i)
                                                    if not changed else None),
                           int(dataset.label(i)))
                read, reencoded = read + size, reencoded + changed
                bar.update(size)
        writer.finish()
    except BaseException as exc:
        writer.abandon()
        add_note(exc, f"gpufeed pack: {len(done_shards) + len(writer.done)} shards are complete "
                      f"in {out_dir}; run the same pack again to resume after them")
        raise
    finally:
        bar.close()
    os.unlink(os.path.join(out_dir, JOB_FILE))
    shards = tuple(done_shards + writer.done)
    return TarPackResult(shards, len(dataset), read, writer.bytes_written, reencoded,
                         time.perf_counter() - start, len(done_shards), bool(verify),
                         tuple(skipped))


def _path_of(dataset: Any, i: int) -> str | None:
    path = getattr(dataset, "path", None)
    return path(i) if callable(path) else None


def _job(dataset: Any, src: Any, shard_bytes: int, max_samples: int | None, prefix: str,
         max_side: int | None, quality: int | None) -> dict[str, Any]:
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = [dataset.label(i) for i in range(len(dataset))]
    digest = hashlib.blake2b(np.asarray(labels, np.int64).tobytes())
    for i in range(len(dataset)):
        digest.update(dataset.describe(i).encode("utf-8", "surrogateescape") + b"\0")
    return {"format": "gpufeed-tar-pack", "version": 1,
            "src": os.path.abspath(src) if isinstance(src, (str, os.PathLike)) else repr(src)[:200],
            "count": len(dataset), "samples": digest.hexdigest(), "shard_bytes": shard_bytes,
            "max_samples": max_samples, "prefix": prefix, "max_side": max_side,
            "quality": quality}


def shard_name(prefix: str, k: int) -> str:
    return f"{prefix}-{k:06d}.tar"


def _resume(out_dir: str, prefix: str, job: dict[str, Any]) -> tuple[list[str], int]:
    """(the done shards of this job in ``out_dir``, the first sample not in them); creates
    ``out_dir`` and its job file for a fresh pack."""
    job_path = os.path.join(out_dir, JOB_FILE)
    if os.path.exists(job_path):
        with open(job_path) as f:
            found = json.load(f)
        if found != job:
            raise FileExistsError(f"{out_dir!r} holds a partial pack of another source or "
                                  f"options ({JOB_FILE}); delete the directory or pass another")
        done: list[str] = []
        first = 0
        while True:
            path = os.path.join(out_dir, shard_name(prefix, len(done)))
            members = _sidecar(path)
            if members is None:
                break
            done.append(path)
            if members.names:  # the next sample follows the last key written
                first = int(members.names[-1].split(".", 1)[0]) + 1
        logger.info("pack: resuming %s after %d shards (%d samples)", out_dir, len(done), first)
        return done, first
    if os.path.isdir(out_dir) and any(n.startswith(prefix + "-") for n in os.listdir(out_dir)):
        raise FileExistsError(f"{out_dir!r} already holds {prefix}-* shards; pass a new "
                              f"directory or delete them first")
    os.makedirs(out_dir, exist_ok=True)
    with open(job_path, "w") as f:
        json.dump(job, f)
    return [], 0


def _sidecar(path: str) -> Any:
    try:
        with open(path + SIDECAR_SUFFIX, "rb") as f:
            data = f.read()
        return read_sidecar(data, os.path.getsize(path))
    except OSError:
        return None


def _prepared(ex: ThreadPoolExecutor, dataset: Any, first: int, workers: int,
              max_side: int | None, quality: int | None, verify: bool, on_error: str,
              ) -> Iterator[tuple[int, tuple[int, bytes, bool] | str]]:
    """(i, (bytes read, bytes to store, re-encoded)) for samples ``first..``, in order, read
    and prepared on ``ex`` a bounded window ahead; (i, why) for one skipped."""
    def load(i: int) -> tuple[int, bytes, bool]:
        data = bytes(dataset.read(i))
        value, changed = _prepare(data, max_side, quality)
        if verify and not changed:
            verify_image(data)
        return len(data), value, changed

    n = len(dataset)
    window: deque = deque()
    nxt = first
    while nxt < n and len(window) < 4 * workers:
        window.append((nxt, ex.submit(load, nxt)))
        nxt += 1
    while window:
        i, future = window.popleft()
        item: tuple[int, bytes, bool] | str
        try:
            item = future.result()
        except DecodeError as exc:
            item = skip_or_raise(exc, dataset.describe(i), i, on_error)
        if nxt < n:
            window.append((nxt, ex.submit(load, nxt)))
            nxt += 1
        yield i, item


class _ShardWriter:
    """Appends samples to the current shard; closes it at the size or count limit."""

    def __init__(self, out_dir: str, prefix: str, first_shard: int, shard_bytes: int,
                 max_samples: int | None) -> None:
        self.out_dir, self.prefix, self.k = out_dir, prefix, first_shard
        self.shard_bytes, self.max_samples = shard_bytes, max_samples
        self.done: list[str] = []
        self.bytes_written = 0
        self._tar: tarfile.TarFile | None = None
        self._file: Any = None
        self._count = 0

    def _path(self) -> str:
        return os.path.join(self.out_dir, shard_name(self.prefix, self.k))

    def add(self, i: int, data: bytes, ext: str, label: int) -> None:
        if self._tar is None:
            self._file = open(self._path() + ".partial", "wb")
            self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)
        key = f"{i:09d}"
        for name, body in ((f"{key}.{ext}", data), (f"{key}.cls", str(label).encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(body), 0, 0o444
            info.uname = info.gname = "gpufeed"
            self._tar.addfile(info, io.BytesIO(body))
        self.bytes_written += len(data)
        self._count += 1
        if (self._file.tell() >= self.shard_bytes
                or (self.max_samples is not None and self._count >= self.max_samples)):
            self._close_shard()

    def _close_shard(self) -> None:
        assert self._tar is not None and self._file is not None  # called with a shard open
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        path = self._path()
        os.replace(path + ".partial", path)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            members = walk(local_reader(fd), size, path)
        finally:
            os.close(fd)
        write_npz(path + SIDECAR_SUFFIX, sidecar_arrays(members, size), "the tar sidecar index")
        self.done.append(path)
        self._tar, self._file, self._count = None, None, 0
        self.k += 1

    def finish(self) -> None:
        if self._tar is not None:
            self._close_shard()

    def abandon(self) -> None:
        """Drop the shard being written (a rerun writes it again)."""
        if self._file is not None:
            self._file.close()
            try:
                os.unlink(self._path() + ".partial")
            except OSError:
                pass
        self._tar, self._file = None, None
