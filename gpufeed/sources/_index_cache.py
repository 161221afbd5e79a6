"""ImageFolder's index: a parallel scan, optionally kept in a cache file between runs.

The cache file (``ImageFolder(root, index_cache=PATH)``) is an ``.npz`` archive read with
``allow_pickle=False`` (plain arrays, never a pickle), format "gpufeed-index" version 1:

==========  ==============================================================================
array       content
==========  ==============================================================================
``meta``    uint8 UTF-8 JSON: format, version, root (absolute), classes, extensions,
            is_valid_file (its qualified name or null), allow_empty, signature
``blob``    uint8: the relative paths (file-system encoded), concatenated
``offsets`` int64: path ``i`` is ``blob[offsets[i]:offsets[i + 1]]``
``labels``  int64: one per sample
``dirs``    uint8 / ``dir_offsets`` int64: every directory walked, relative to the root
``dir_mtime_ns``  int64: its ``st_mtime_ns`` when it was listed
``dir_names``     uint8 (n, 16): a digest of its entry names
==========  ==============================================================================

The index (paths and labels) depends only on the tree's *names*: which files and directories
exist where. Two checks decide whether the cached one still holds (``index_check``):

* ``"directories"`` (default): stat every directory the index was built from (about 1,000 for
  ImageNet, not 1.28M files). Creating, removing or renaming an entry (a link too) sets its
  directory's ``st_mtime_ns``; a changed time, or a directory gone, is a miss. Modification
  times can be coarse (FAT 2 s, some NFS servers 1 s, and ext4's clock ticks every few ms), so a
  change made in the same tick as the listing would keep the time: a directory whose time lies
  within :data:`RACY_NS` of when the cache was written is listed again and its names compared
  with the digest kept (git's "racy index" rule); once that window has passed, the cache is
  rewritten so the next start need not list it. A file rewritten in place changes nothing
  here, and changes nothing in the index either. Clock skew between this host and a network
  file server larger than the window defeats the rule: use ``"files"`` there.
* ``"files"``: list every directory and stat every file: a digest of every directory's path,
  ``st_mtime_ns`` and entry count and every file's name, size and ``st_mtime_ns``. Nothing
  escapes it, but it costs more than the scan it replaces (a ``stat`` per file: measured 13 us
  here, against 1 us per file to list); for an ``is_valid_file`` that looks at file contents.

A hit saves the listing (with "directories"), the sorting, the extension filtering or
``is_valid_file`` calls, and building the path strings and the table. A changed
``is_valid_file`` keeps its qualified name: pass a new cache path then.

The file is written to a temporary name beside it and moved into place (``os.replace``), so a
reader sees the old file or the new one, never half of one. A file that is not a valid index
(corrupt, foreign, another version) is ignored with a warning and rewritten.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufeed.errors import describe_callable
from gpufeed.sources._npz import READ_ERRORS, meta_array, read_npz, write_npz
from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._scan import (
    DEFAULT_SCAN_THREADS,
    ClassListing,
    names_digest,
    select,
    walk_classes,
)
from gpufeed.sources._shared import SharedArray

logger = logging.getLogger(__name__)

FORMAT = "gpufeed-index"
VERSION = 1
CHECKS = ("directories", "files")
#: Directories modified this close (ns) before the cache was written are listed again on load.
RACY_NS = 2_000_000_000


class IndexCacheWarning(UserWarning):
    """An index cache file could not be used (it is rewritten)."""


def build_index(root: str, class_to_idx: dict[str, int], extensions: tuple[str, ...],
                is_valid_file: Callable[[str], bool] | None, allow_empty: bool,
                index_cache: str | None = None, index_check: str = "directories",
                threads: int = DEFAULT_SCAN_THREADS) -> tuple[PathTable, SharedArray]:
    """(paths relative to ``root``, labels) of an image folder, in torchvision's order: from
    ``index_cache`` when ``index_check`` finds the tree unchanged, else from a parallel scan
    (which then rewrites ``index_cache``, if given)."""
    if index_check not in CHECKS:
        raise ValueError(f"`index_check` must be one of {', '.join(map(repr, CHECKS))}. "
                         f"Found: {index_check!r}.")
    names = sorted(class_to_idx, key=class_to_idx.__getitem__)
    meta: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "root": os.path.abspath(root), "classes": names,
        "extensions": list(extensions),
        "is_valid_file": None if is_valid_file is None else _callable_name(is_valid_file),
        "allow_empty": bool(allow_empty), "check": index_check, "signature": None}
    by_files = index_cache is not None and index_check == "files"
    if index_cache is not None and not by_files:
        hit = _load(index_cache, meta, root)
        if hit is not None:
            return hit
    listings = walk_classes(root, names, stat=by_files, threads=threads)
    if index_cache is not None and by_files:
        meta["signature"] = [listing.digest for listing in listings]
        hit = _load(index_cache, meta, root)
        if hit is not None:
            return hit
    paths, labels = select(root, class_to_idx, listings, extensions, is_valid_file, allow_empty)
    table, label_arr = PathTable(paths), labels_array(labels)
    if index_cache is not None:
        _save(index_cache, meta, {"blob": table.blob, "offsets": table.offsets,
                                  "labels": label_arr, **_dir_arrays(root, listings)})
    return table, label_arr


def _callable_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{describe_callable(fn)}"


def _dir_arrays(root: str, listings: list[ClassListing]) -> dict[str, np.ndarray]:
    prefix_len = len(os.path.join(root, ""))
    dirs = [d for listing in listings for d in listing.dirs]
    table = PathTable(top[prefix_len:] for top, *_ in dirs)
    return {"dirs": np.asarray(table.blob), "dir_offsets": np.asarray(table.offsets),
            "dir_mtime_ns": np.array([d[2] for d in dirs], dtype=np.int64),
            "dir_names": np.frombuffer(b"".join(d[3] for d in dirs), np.uint8).reshape(-1, 16)}


def _load(path: str, meta: dict[str, Any], root: str) -> tuple[PathTable, SharedArray] | None:
    """The cached index if ``path`` holds one for exactly ``meta`` and (check "directories")
    every directory it lists is unchanged; None (and a warning when the file exists but is not
    a valid index) otherwise."""
    if not os.path.exists(path):
        return None
    try:
        arrays, found = read_npz(path, FORMAT, VERSION)
        written_ns = found.pop("written_ns", None)
        if found != meta:
            changed = sorted(k for k in meta if found.get(k) != meta[k])
            logger.info("index cache %s is stale (%s changed): rescanning", path,
                        ", ".join(changed))
            return None
        dirs = PathTable.from_arrays(arrays["dirs"], arrays["dir_offsets"])
        mtimes, digests = arrays["dir_mtime_ns"], arrays["dir_names"]
        if (mtimes.dtype != np.int64 or mtimes.shape != (len(dirs),)
                or digests.dtype != np.uint8 or digests.shape != (len(dirs), 16)
                or not isinstance(written_ns, int)):
            raise ValueError(f"directory records do not match: {len(dirs)} directories, "
                             f"times {mtimes.dtype}{mtimes.shape}, names {digests.shape}")
        table = PathTable.from_arrays(arrays["blob"], arrays["offsets"])
        labels = arrays["labels"]
        if labels.dtype != np.int64 or labels.shape != (len(table),):
            raise ValueError(f"labels {labels.dtype}{labels.shape} for {len(table)} paths")
    except READ_ERRORS as exc:
        warnings.warn(f"index cache {path!r} is not a valid {FORMAT} v{VERSION} file "
                      f"({type(exc).__name__}: {str(exc)[:200]}); ignoring it, rescanning and "
                      f"rewriting it", IndexCacheWarning, stacklevel=4)
        return None
    if meta["check"] == "directories":
        unchanged, racy = _directories_unchanged(root, dirs, mtimes, digests, written_ns)
        if not unchanged:
            logger.info("index cache %s is stale (a directory changed): rescanning", path)
            return None
        if racy and time.time_ns() > int(mtimes.max()) + RACY_NS:
            _save(path, meta, arrays)  # past the window now: the next start need not list them
    return table, labels_array(labels)


def _directories_unchanged(root: str, dirs: PathTable, mtimes: np.ndarray, digests: np.ndarray,
                           written_ns: int) -> tuple[bool, bool]:
    """(every directory has its recorded mtime, and the racy ones their recorded names;
    whether any was racy)."""
    prefix = os.path.join(root, "")
    racy = False
    for i in range(len(dirs)):
        top = prefix + dirs[i]
        try:
            mtime = os.stat(top).st_mtime_ns
        except OSError:
            return False, racy
        if mtime != mtimes[i]:
            return False, racy
        if mtime >= written_ns - RACY_NS:
            racy = True
            try:
                listed = os.listdir(top)
            except OSError:
                return False, racy
            if names_digest(listed) != digests[i].tobytes():
                return False, racy
    return True, racy


def _save(path: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write the index atomically; a failure is logged, not raised: the dataset works without
    its cache."""
    out = {k: np.asarray(v) for k, v in arrays.items()}
    out["meta"] = meta_array({**meta, "written_ns": time.time_ns()})
    write_npz(path, out, "the index cache", "; the next run scans again")
