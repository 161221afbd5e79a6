"""``CocoDetection(..., index_cache=PATH)``: the parsed annotation tables kept in a file.

Parsing a COCO file of train2017's size takes about 23 s and peaks at about 4.3 GB here
(``benchmarks/results/coco-parse.md``); every rank of a job and every run does it again. With
``index_cache`` the tables (:class:`~gpufeed.sources._coco_parse.CocoTables`) are written once to
an ``.npz`` archive, read with ``allow_pickle=False`` (plain arrays, never a pickle), format
"gpufeed-coco" version 1: each table under its own name, the image file names as a
:class:`~gpufeed.sources._paths.PathTable`'s ``files_blob`` cut at ``files_offsets``, and a
``meta`` JSON array holding the format, version and the SHA-1 of the annotation file's bytes.

The file is used only when its digest equals the annotation file's, so any change to the
annotation file (even one that keeps its size and time) rebuilds the tables. Hashing reads
the whole file; that costs about 1 s for 610 MB, against the parse it replaces.
When no valid cache exists, one process at a time builds it (an flock on ``PATH.lock``): the
other ranks of a job wait, then read it. The file is written atomically beside its final name
(``_npz.write_npz``); a file that is not a valid cache (corrupt, foreign, another version,
inconsistent tables) is ignored with an
:class:`~gpufeed.sources._index_cache.IndexCacheWarning` and rewritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpufeed.sources._coco_parse import CocoTables
from gpufeed.sources._index_cache import IndexCacheWarning
from gpufeed.sources._npz import READ_ERRORS, meta_array, read_npz, write_npz
from gpufeed.sources._paths import PathTable

__all__ = ["cached_tables", "file_digest", "load_tables", "save_tables"]

logger = logging.getLogger(__name__)

FORMAT = "gpufeed-coco"
VERSION = 1

#: table -> (dtype (None: checked apart), trailing shape, what its length counts: "images",
#: "images+1", "annotations", or None (any length))
_LAYOUT: dict[str, tuple[Any, tuple[int, ...], str | None]] = {
    "ids": (np.int64, (), "images"), "sizes": (np.int64, (2,), "images"),
    "offsets": (np.int64, (), "images+1"), "bbox": (np.float64, (4,), "annotations"),
    "bbox_int": (np.bool_, (), "annotations"), "category": (np.int64, (), "annotations"),
    "iscrowd": (np.int64, (), "annotations"), "area": (np.float64, (), "annotations"),
    "area_int": (np.bool_, (), "annotations"), "missing": (np.uint8, (), "annotations"),
    "kind": (np.uint8, (), "annotations"), "seg_lo": (np.int64, (), "annotations"),
    "seg_hi": (np.int64, (), "annotations"), "seg_size": (np.int64, (2,), "annotations"),
    "coords": (None, (), None), "poly_off": (np.int64, (), None), "rle_blob": (np.uint8, (), None),
}


def file_digest(path: str, chunk_bytes: int = 16 << 20) -> str:
    """SHA-1 of the file's bytes (hex), read in chunks."""
    digest = hashlib.sha1(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _meta(digest: str) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "sha1": digest}


def save_tables(path: str, digest: str, tables: CocoTables) -> None:
    """Write ``tables`` (parsed from an annotation file whose SHA-1 is ``digest``) to ``path``;
    a failure is logged, not raised."""
    arrays = {name: getattr(tables, name) for name in _LAYOUT}
    files = PathTable(tables.files)
    arrays["files_blob"], arrays["files_offsets"] = np.asarray(files.blob), np.asarray(files.offsets)
    arrays["meta"] = meta_array(_meta(digest))
    write_npz(path, arrays, "the COCO index cache", "; the next run parses the annotation file again")


def load_tables(path: str, digest: str) -> CocoTables | None:
    """The tables ``path`` holds for an annotation file whose SHA-1 is ``digest``; None when
    there is no such file, when it was written for other contents, or (with a warning) when it
    is not a valid cache."""
    if not os.path.exists(path):
        return None
    try:
        arrays, meta = read_npz(path, FORMAT, VERSION)
        if meta != _meta(digest):
            logger.info("COCO index cache %s was written for another annotation file: parsing", path)
            return None
        return _tables(arrays)
    except READ_ERRORS as exc:
        warnings.warn(f"COCO index cache {path!r} is not a valid {FORMAT} v{VERSION} file "
                      f"({type(exc).__name__}: {str(exc)[:200]}); ignoring it, parsing the annotation "
                      f"file and rewriting it", IndexCacheWarning, stacklevel=3)
        return None


def _tables(arrays: dict[str, np.ndarray]) -> CocoTables:
    """The tables of a read cache, every array's dtype, shape and offsets checked (ValueError)."""
    ids, offsets = arrays["ids"], arrays["offsets"]
    counts = {"images": len(ids), "images+1": len(ids) + 1,
              "annotations": int(offsets[-1]) if len(offsets) else -1}
    for name, (dtype, tail, count) in _LAYOUT.items():
        a = arrays[name]
        if (dtype is not None and a.dtype != dtype) or a.shape[1:] != tail or (
                count is not None and len(a) != counts[count]):
            raise ValueError(f"table {name} is {a.dtype}{a.shape}")
    if arrays["coords"].dtype not in (np.int32, np.float64):
        raise ValueError(f"coords are {arrays['coords'].dtype}")
    files = PathTable.from_arrays(arrays["files_blob"], arrays["files_offsets"])  # checks the offsets
    if len(files) != len(ids):
        raise ValueError(f"{len(files)} file names for {len(ids)} images")
    return CocoTables(files=files.tolist(), **{name: arrays[name] for name in _LAYOUT})


#: longest wait (s) for another process building the same cache before building it too
LOCK_WAIT_S = 1800.0
_POLL_S = 0.05


@contextlib.contextmanager
def _built_by_one(path: str, wait_s: float) -> Iterator[None]:
    """Hold ``PATH.lock`` (flock): the ranks of a job that find no cache wait while one of them
    builds it, then read it, instead of each parsing the file at once (each peaking at about
    the JSON's size). A holder that dies releases the lock (the kernel drops its flock); after
    ``wait_s`` of a live holder, or where the lock file cannot be made, this one proceeds
    without it."""
    try:
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        logger.info("COCO index cache %s: no lock file (%s); building without it", path, exc)
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    logger.warning("COCO index cache %s: another process has been building it for "
                                   "over %.0f s; building it here too", path, wait_s)
                    break
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


def _stamp(path: str) -> tuple[int, int, int] | None:
    """(inode, size, modification time in ns) of the file at ``path``; None when there is none.
    A cache is replaced whole (``os.replace``), so a new one has a new inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def cached_tables(path: str | None, ann_file: str, parse: Callable[[], CocoTables],
                  wait_s: float = LOCK_WAIT_S) -> CocoTables:
    """``parse()`` (the annotation file's tables), through the cache file ``path`` when given;
    one process at a time looks the cache up and builds it (:func:`_built_by_one`)."""
    if path is None:
        return parse()
    digest = file_digest(ann_file)
    seen = _stamp(path)
    tables = load_tables(path, digest)
    if tables is not None:
        return tables
    with _built_by_one(path, wait_s):
        # written while this one waited (read again only then: a stale or damaged file is
        # read, and warned about, once)
        tables = load_tables(path, digest) if _stamp(path) != seen else None
        if tables is None:
            tables = parse()
            save_tables(path, digest, tables)
    return tables

