"""LMDBDataset: images and labels from one LMDB file written by ``gpufeed pack``, for fast random reads.

Layout (format "gpufeed-lmdb", version 1), all in the main database:

=================  ========================================================================
key                value
=================  ========================================================================
``0000000000``...  encoded image bytes of sample i (``%010d``), as stored or re-encoded JPEG
``__labels__``     int64 little-endian labels, one per sample
``__paths__``      JSON list of the source paths relative to the packed folder (for messages)
``__gpufeed__``    JSON metadata: format, version, count, classes, max_side, quality, and
                   ``skipped`` (the source files left out); written last, so a pack that did
                   not finish has none
=================  ========================================================================

:func:`gpufeed.sources.pack` (``gpufeed.sources._pack``) writes it, resumably.

An LMDB environment must not cross ``fork``: each process opens its own, read-only, without
locking or read-ahead, on first read; pickling (for spawn) drops it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import numpy as np

from gpufeed.sources._base import DEFAULT_READ_CONCURRENCY, ImageSource
from gpufeed.sources._paths import labels_array
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES

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
