"""TarShards: images in tar shards (the WebDataset convention), read by offset.

A sample is read with one positioned read (``os.pread``) of its image member's header and data
locally, one ranged request remotely: the 512-byte header is checked against the index (its
checksum, size and name), so a shard rewritten after it was indexed fails the read
(:class:`~gpufeed.errors.ReadError`, which the loader's ``on_error="skip"`` counts) instead of
yielding another sample's bytes. Each process opens a shard on its first read and keeps up to
:data:`MAX_OPEN_SHARDS` open; opening checks its size and mtime against the index.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import ReadError, check_int
from gpufeed.sources._base import DEFAULT_READ_CONCURRENCY, ImageSource, LabelArray
from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES
from gpufeed.sources._remote import RemoteOptions, RemoteReader, is_url, read_concurrency_for
from gpufeed.sources._shared import share
from gpufeed.sources._tar_cache import (
    DEFAULT_INDEX_THREADS,
    SIDECAR_SUFFIX,
    Signature,
    build,
    key_table,
    local_signature,
    read_sidecar,
    walk_local,
)
from gpufeed.sources._tar_index import (
    DEFAULT_IMAGE_EXTENSIONS,
    REASONS,
    LabelSpec,
    ShardIndex,
    expand_urls,
    label_name,
)
from gpufeed.sources._tar_targets import target_table
from gpufeed.sources._tar_walk import (
    BLOCK,
    Members,
    TarFormatError,
    checksum_ok,
    file_reader,
    header_name,
    parse_number,
    walk,
)

#: Shards a process keeps open for reading at once (least recently used ones are closed).
MAX_OPEN_SHARDS = 128


@dataclass(frozen=True)
class TarIndexReport:
    """What indexing found: shards, samples, and the samples left out by reason (with
    ``on_error="skip"``; reasons in :data:`gpufeed.sources._tar_index.REASONS`)."""

    shards: int
    samples: int
    skipped: dict[str, int]

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())


class TarShards(LabelArray, ImageSource):
    """Images and labels in tar shards, one sample per WebDataset key, read by offset.

    ``urls``: a shard path or URL, a list of them, a brace pattern (``train-{0000..0127}.tar``)
    or a glob of local paths (``data/*.tar``); shards keep the given order (globs: sorted).
    URLs (``s3://``, ``gs://``, ``http(s)://``...; ``pip install gpufeed[remote]``) are read
    through fsspec with ``storage_options`` and ``remote_options`` as for
    :class:`~gpufeed.sources.ImageFolder`, one ranged request per sample.

    Every shard is indexed once: local ones by a walk over their tar headers (seeking past the
    data, ``index_threads`` shards at once), remote ones from a sidecar ``SHARD.idx`` (which
    ``gpufeed pack --format tar`` writes) or else one streaming pass. ``index_cache``: a local
    file keeping the index between runs; a shard whose size or mtime (ETag remotely) changed is
    indexed again.

    Members group into samples by key (``dir/000123.jpg`` + ``dir/000123.cls``), as in
    webdataset. ``image_extensions``: the image member is the sample's first member with one of
    these extensions (in this order of preference). ``label`` says what each sample's target is:
    an extension name takes the sample's member with that extension (up to 64 KiB), decoded as
    webdataset decodes it: ``"cls"`` (default), ``"cls2"``, ``"class"``, ``"count"``,
    ``"index"``, ``"inx"``, ``"id"``: an int; ``"txt"``, ``"text"``, ``"transcript"``: a str;
    ``"json"``, ``"jsn"``: the parsed JSON object; any other extension: the member's bytes. A
    function is given ``{"__key__": key, EXT: bytes, ...}`` of the sample's members up to 64 KiB
    and returns the target, any picklable object, at index time. None: every target is -1.
    Int targets are batched as int64 labels; others are collated as ``DataLoader``'s
    ``default_collate`` does (a list of str for captions, a dict of tensors for JSON objects...).
    ``on_error``: ``"raise"`` (default) stops at the first sample without an image or label,
    duplicate key, truncated shard or file that is not a tar, naming the shard, the member and
    its byte offset; ``"skip"`` leaves them out and counts them in :attr:`report`.

    ``transform``, ``target_transform``, ``read_concurrency``, ``read_budget_bytes``: as for
    :class:`~gpufeed.sources.ImageFolder` (default reads in flight: automatic locally, 16 for
    URLs).
    """

    def __init__(self, urls: str | os.PathLike | Sequence[str | os.PathLike],
                 transform: Any | None = None,
                 target_transform: Callable[[Any], Any] | None = None, *,
                 label: LabelSpec = "cls",
                 image_extensions: Sequence[str] = DEFAULT_IMAGE_EXTENSIONS,
                 on_error: str = "raise",
                 read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES,
                 storage_options: dict[str, Any] | None = None,
                 remote_options: RemoteOptions | None = None,
                 index_cache: str | os.PathLike | None = None,
                 index_threads: int = DEFAULT_INDEX_THREADS) -> None:
        self.shards = expand_urls(urls)
        exts = _check_options(label, image_extensions, on_error, index_threads, target_transform)
        remote = any(is_url(s) for s in self.shards)
        if not remote and (storage_options is not None or remote_options is not None):
            raise ValueError("`storage_options` and `remote_options` apply to shard URLs "
                             "(s3://, gs://, http(s)://...); every shard here is a local path.")
        self.remote = RemoteReader(storage_options, remote_options) if remote else None
        self.set_read_options(read_concurrency_for(remote, read_concurrency,
                                                   DEFAULT_READ_CONCURRENCY), read_budget_bytes)
        self.transform = transform
        self.target_transform = target_transform
        self.image_extensions = exts
        self._image_suffixes = tuple("." + e for e in exts)
        self.index_cache = None if index_cache is None else os.fspath(index_cache)
        self._label_ext = label if isinstance(label, str) else None
        options = {"image_extensions": exts, "label": label_name(label), "label_fn": label,
                   "on_error": on_error}
        signatures = [self._signature(s) for s in self.shards]
        self._sizes_by_url = {s: sig[0] for s, sig in zip(self.shards, signatures)}
        indexes = build(self.shards, signatures, options, self._walk, self.index_cache,
                        index_threads)
        self._set_tables(indexes, signatures)

    # -- index ---------------------------------------------------------------------------------
    def _signature(self, shard: str) -> Signature:
        if is_url(shard):
            assert self.remote is not None  # set whenever a shard is a URL
            return self.remote.signature(shard)
        try:
            return local_signature(shard)
        except FileNotFoundError:
            raise FileNotFoundError(f"tar shard {shard!r} does not exist") from None

    def _walk(self, shard: str) -> tuple[Members, TarFormatError | None]:
        if not is_url(shard):
            return walk_local(shard, self._keep)
        assert self.remote is not None
        size = self._sizes_by_url[shard]
        try:
            members = read_sidecar(self.remote.read(shard + SIDECAR_SUFFIX), size)
        except ReadError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            members = None
        if members is not None:
            return members, None
        with self.remote.open(shard) as f:
            try:
                return walk(file_reader(f), size, shard, self._keep), None
            except TarFormatError as exc:
                return exc.members, exc

    def _keep(self, name: str) -> bool:
        """Whether the walk keeps a small member's contents: all but the images."""
        return not name.lower().endswith(self._image_suffixes)

    def _set_tables(self, indexes: list[ShardIndex], signatures: list[Signature]) -> None:
        counts = np.array([len(ix) for ix in indexes], np.int64)
        starts = np.zeros(len(indexes) + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        self._starts = share(starts)
        blob, key_offsets = key_table(indexes)
        self._keys = PathTable.from_arrays(blob, key_offsets)
        def cat(name: str, dtype: Any) -> Any:
            return share(np.concatenate([getattr(ix, name) for ix in indexes]).astype(dtype))

        self._offsets = cat("offsets", np.int64)
        self._sizes = cat("sizes", np.int32 if all(int(ix.sizes.max(initial=0)) < 2**31
                                                   for ix in indexes) else np.int64)
        self._exts = cat("exts", np.uint8)
        self._labels = labels_array(np.concatenate([ix.labels for ix in indexes]))
        self._targets = target_table(indexes, self._label_ext)
        self.int_targets = self._targets is None
        self._signatures = list(signatures)
        skipped = {r: sum(ix.skipped.get(r, 0) for ix in indexes) for r in REASONS}
        self.report = TarIndexReport(len(indexes), int(starts[-1]),
                                     {r: n for r, n in skipped.items() if n})
        self._files: _OpenShards | None = None

    # -- samples -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._labels)

    def shard_of(self, index: int) -> int:
        """The shard number (into :attr:`shards`) holding sample ``index``."""
        return int(np.searchsorted(self._starts, index, side="right")) - 1

    def target(self, index: int) -> Any:
        """The target of sample ``index``: its int label, or the decoded label member, or what
        the label function returned (see ``label``)."""
        if self._targets is None:
            return int(self._labels[index])
        return self._targets[index]

    @property
    def targets(self) -> list[Any]:
        """Every sample's target, as a list (torchvision's ``targets``)."""
        if self._targets is None:
            return self._labels.tolist()
        return [self._targets[i] for i in range(len(self))]

    def key(self, index: int) -> str:
        """The WebDataset key of sample ``index``."""
        return self._keys[index]

    def member(self, index: int) -> str:
        """The image member's name of sample ``index``."""
        return f"{self._keys[index]}.{self.image_extensions[int(self._exts[index])]}"

    def describe(self, index: int) -> str:
        return (f"{self.shards[self.shard_of(index)]}:{self.member(index)} (byte offset "
                f"{int(self._offsets[index])})")

    def read(self, index: int) -> bytes:
        shard_no = self.shard_of(index)
        shard = self.shards[shard_no]
        offset, size = int(self._offsets[index]), int(self._sizes[index])
        if self.remote is not None and is_url(shard):
            raw = self.remote.read_range(shard, offset - BLOCK, offset + size, index)
        else:
            if self._files is None or self._files.pid != os.getpid():
                self._files = _OpenShards(self.shards, self._signatures)
            header, data, got = self._files.read(shard_no, offset - BLOCK, size, index,
                                                 self.describe)
            self._check_header(header, got, index, size)
            return data  # type: ignore[return-value]  # a bytearray: a Buffer like bytes
        self._check_header(raw[:BLOCK], len(raw), index, size)
        return raw[BLOCK:]

    def _check_header(self, raw_header: bytes | bytearray, got: int, index: int,
                      size: int) -> None:
        header = bytes(raw_header)
        name = self.member(index)
        problem = None
        if got != size + BLOCK:
            problem = f"got {max(0, got - BLOCK)} of its {size} bytes (the shard is shorter)"
        elif not checksum_ok(header):
            problem = "no valid tar header precedes it"
        elif parse_number(header[124:136]) not in (size, 0):
            problem = f"its header gives {parse_number(header[124:136])} bytes, the index {size}"
        elif name.isascii() and len(name) <= 100 and not _names_member(header_name(header),
                                                                       self._keys[index], name):
            # (longer or non-ASCII names live in a GNU or pax record before this header)
            problem = f"its header names {header_name(header)!r}"
        if problem is not None:
            raise ReadError(f"cannot read {self.describe(index)} (sample index {index}): "
                            f"{problem}: the shard changed after it was indexed. Index it again "
                            f"(a new TarShards), or pass on_error='skip' to the loader to leave "
                            f"such samples out.")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": None, "_sizes_by_url": {}}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.shards)} shards, {len(self)} images, "
                f"transform={self.transform!r})")


def _names_member(found: str, key: str, member: str) -> bool:
    """Whether a header's name ``found`` is the member ``KEY.EXT`` (``member``, its extension
    lower-cased as the index keeps it): the key exactly, the extension in any case."""
    return (len(found) == len(member) and found.startswith(key)
            and found[len(key):].lower() == member[len(key):])


def _check_options(label: Any, image_extensions: Any, on_error: Any, index_threads: Any,
                   target_transform: Any) -> tuple[str, ...]:
    if label is not None and not isinstance(label, str) and not callable(label):
        raise TypeError(f"`label` must be an extension name (\"cls\"), a function of the "
                        f"sample's small members, or None. Found: {type(label).__name__} "
                        f"{label!r:.80}.")
    if isinstance(image_extensions, str) or not all(
            isinstance(e, str) and e for e in image_extensions):
        raise TypeError(f"`image_extensions` must be a sequence of extension names such as "
                        f"('jpg', 'png'). Found: {image_extensions!r:.80}.")
    exts = tuple(e.lower().lstrip(".") for e in image_extensions)
    if not exts or len(exts) > 255:
        raise ValueError(f"`image_extensions` must name 1 to 255 extensions. Found: {exts!r:.80}.")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"`on_error` must be 'raise' or 'skip'. Found: {on_error!r:.80}.")
    check_int("index_threads", index_threads, 1)
    if target_transform is not None and not callable(target_transform):
        raise TypeError(f"`target_transform` must be a callable or None. Found: "
                        f"{type(target_transform).__name__}.")
    return exts


class _OpenShards:
    """This process's open shard files: up to :data:`MAX_OPEN_SHARDS`, least recently used
    closed first (never one a read thread is using), each checked against its signature."""

    def __init__(self, shards: list[str], signatures: list[Signature]) -> None:
        self.pid = os.getpid()
        self._shards, self._signatures = shards, signatures
        self._open: OrderedDict[int, list[int]] = OrderedDict()  # shard -> [fd, users]
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._open)

    def read(self, shard_no: int, offset: int, size: int, index: int,
             describe: Callable[[int], str]) -> tuple[bytearray, bytearray, int]:
        """(512-byte header at ``offset``, the ``size`` data bytes after it, bytes read) in one
        positioned read."""
        entry = self._acquire(shard_no, index, describe)
        header, data = bytearray(BLOCK), bytearray(size)
        try:
            got = os.preadv(entry[0], [header, data], offset)
        finally:
            with self._lock:
                entry[1] -= 1
        return header, data, got

    def close(self) -> None:
        """Close every open shard (idempotent)."""
        self._finalizer()

    def _acquire(self, shard_no: int, index: int, describe: Callable[[int], str]) -> list[int]:
        with self._lock:
            entry = self._open.get(shard_no)
            if entry is not None:
                self._open.move_to_end(shard_no)
                entry[1] += 1
                return entry
        path = self._shards[shard_no]
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != tuple(self._signatures[shard_no]):
            os.close(fd)
            raise ReadError(f"cannot read {describe(index)} (sample index {index}): tar "
                            f"shard {path!r} changed after it was indexed (size "
                            f"{st.st_size}, mtime_ns {st.st_mtime_ns}; indexed "
                            f"{tuple(self._signatures[shard_no])}). Index it again (a new "
                            f"TarShards), or pass on_error='skip' to the loader.")
        with self._lock:
            entry = self._open.get(shard_no)
            if entry is not None:  # another thread opened it meanwhile
                os.close(fd)
            else:
                entry = self._open[shard_no] = [fd, 0]
            entry[1] += 1
            self._evict()
            return entry

    def _evict(self) -> None:
        for shard_no in list(self._open):
            if len(self._open) <= MAX_OPEN_SHARDS:
                return
            if self._open[shard_no][1] == 0:
                os.close(self._open.pop(shard_no)[0])


def _close_all(open_files: OrderedDict[int, list[int]]) -> None:
    while open_files:
        _, (fd, _users) = open_files.popitem()
        try:
            os.close(fd)
        except OSError:
            pass
