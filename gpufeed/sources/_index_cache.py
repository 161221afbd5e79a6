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
==========  ==============================================================================

The signature is a digest, per class folder, of every directory's path, ``st_mtime_ns`` and
entry count and of every file's name, size and ``st_mtime_ns`` (see ``gpufeed.sources._scan``):
adding, removing or renaming a file or directory, or rewriting a file, changes it even where
the file system keeps coarse (1-2 s) modification times, since counts, names and sizes are in
it too. Checking it still lists every directory and stats every file; what a hit saves is the
sorting, the extension filtering (or ``is_valid_file`` calls), building the path strings and
the table. A changed ``is_valid_file`` keeps its qualified name: pass a new cache path then.

The file is written to a temporary name beside it and moved into place (``os.replace``), so a
reader sees the old file or the new one, never half of one. A file that is not a valid index
(corrupt, foreign, another version) is ignored with a warning and rewritten.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufeed.sources._base import describe_callable
from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._scan import DEFAULT_SCAN_THREADS, select, walk_classes
from gpufeed.sources._shared import SharedArray

logger = logging.getLogger(__name__)

FORMAT = "gpufeed-index"
VERSION = 1


class IndexCacheWarning(UserWarning):
    """An index cache file could not be used (it is rewritten)."""


def build_index(root: str, class_to_idx: dict[str, int], extensions: tuple[str, ...],
                is_valid_file: Callable[[str], bool] | None, allow_empty: bool,
                index_cache: str | None = None,
                threads: int = DEFAULT_SCAN_THREADS) -> tuple[PathTable, SharedArray]:
    """(paths relative to ``root``, labels) of an image folder, in torchvision's order: from
    ``index_cache`` when its signature matches the tree, else from a parallel scan (which then
    rewrites ``index_cache``, if given)."""
    names = sorted(class_to_idx, key=class_to_idx.__getitem__)
    listings = walk_classes(root, names, stat=index_cache is not None, threads=threads)
    meta: dict[str, Any] | None = None
    if index_cache is not None:
        meta = {"format": FORMAT, "version": VERSION, "root": os.path.abspath(root),
                "classes": names, "extensions": list(extensions),
                "is_valid_file": None if is_valid_file is None else _callable_name(is_valid_file),
                "allow_empty": bool(allow_empty),
                "signature": [listing.digest for listing in listings]}
        hit = _load(index_cache, meta)
        if hit is not None:
            return hit
    paths, labels = select(root, class_to_idx, listings, extensions, is_valid_file, allow_empty)
    table, label_arr = PathTable(paths), labels_array(labels)
    if index_cache is not None and meta is not None:
        _save(index_cache, meta, table, label_arr)
    return table, label_arr


def _callable_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{describe_callable(fn)}"


def _load(path: str, meta: dict[str, Any]) -> tuple[PathTable, SharedArray] | None:
    """The cached index if ``path`` holds one for exactly ``meta``; None (and a warning when the
    file exists but is not a valid index) otherwise."""
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            found = json.loads(npz["meta"].tobytes().decode("utf-8"))
            if not isinstance(found, dict) or found.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} file")
            if found.get("version") != VERSION:
                raise ValueError(f"version {found.get('version')!r}, this gpufeed reads {VERSION}")
            if found != meta:
                changed = sorted(k for k in meta if found.get(k) != meta[k])
                logger.info("index cache %s is stale (%s changed): rescanning", path,
                            ", ".join(changed))
                return None
            table = PathTable.from_arrays(npz["blob"], npz["offsets"])
            labels = np.asarray(npz["labels"])
            if labels.dtype != np.int64 or labels.shape != (len(table),):
                raise ValueError(f"labels {labels.dtype}{labels.shape} for {len(table)} paths")
            return table, labels_array(labels)
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        warnings.warn(f"index cache {path!r} is not a valid {FORMAT} v{VERSION} file "
                      f"({type(exc).__name__}: {str(exc)[:200]}); ignoring it, rescanning and "
                      f"rewriting it", IndexCacheWarning, stacklevel=4)
        return None


def _save(path: str, meta: dict[str, Any], table: PathTable, labels: np.ndarray) -> None:
    """Write the index atomically (temporary file beside ``path``, then ``os.replace``); a
    failure is logged, not raised: the dataset works without its cache."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8),
                     blob=np.asarray(table.blob), offsets=np.asarray(table.offsets),
                     labels=np.asarray(labels))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        logger.warning("could not write the index cache %s (%s); the next run scans again",
                       path, exc)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
