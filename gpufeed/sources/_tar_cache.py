"""Building tar shards' index in parallel, the sidecar member files and the local index cache.

**Sidecar** (``SHARD.idx``, written by :func:`gpufeed.pack_tar` beside
each shard): a plain ``.npz`` (read with ``allow_pickle=False``) of the shard's members, format
"gpufeed-tar-members" version 1: ``meta`` (UTF-8 JSON: format, version, ``shard_bytes``),
``names``/``name_offsets`` (UTF-8 member names, concatenated), ``offsets`` and ``sizes``
(int64, of each member's data), ``small``/``small_offsets`` (the contents of members up to
64 KiB, concatenated; -1 offsets for larger ones). A remote shard is indexed from its sidecar
when there is one whose ``shard_bytes`` is the shard's size, else by one streaming pass.

**Index cache** (``TarShards(..., index_cache=PATH)``): an ``.npz`` of format
"gpufeed-tar-index" version 1: ``meta`` (JSON: the options that shape the index, and per
shard its path or URL, size, mtime or ETag, sample count and skipped counts), then the
samples of every shard in order: ``keys``/``key_offsets``, ``offsets``, ``sizes``, ``exts``,
``labels``, and ``targets``/``target_offsets`` (the label members' bytes of shards whose
``target_kind`` is "member"; ``gpufeed.sources._tar_targets``). An index holding a label
function's results other than ints is not kept (they would be pickles). On load each shard is
checked (a ``stat``, or an ``info`` request remotely): a shard whose size or time changed, or
that is new, is indexed again, the others are taken from the file; the file is rewritten when
anything changed, atomically (temporary file, then ``os.replace``). A file that is not a valid
index is ignored with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gpufeed.sources._index_cache import IndexCacheWarning
from gpufeed.sources._npz import READ_ERRORS, meta_array, read_npz, write_npz
from gpufeed.sources._tar_index import KEY_RULE, ShardIndex, index_shard
from gpufeed.sources._tar_targets import TARGET_RULE
from gpufeed.sources._tar_walk import Members, TarFormatError, local_reader, walk

logger = logging.getLogger(__name__)

_LOAD_ERRORS: tuple[type[Exception], ...] = (*READ_ERRORS, TypeError)  # a cache of other shapes

CACHE_FORMAT = "gpufeed-tar-index"
SIDECAR_FORMAT = "gpufeed-tar-members"
VERSION = 1
SIDECAR_SUFFIX = ".idx"
#: Threads indexing shards at once (local walks release the GIL in their reads; remote ones
#: wait on the network).
DEFAULT_INDEX_THREADS = 8

#: A shard's signature: (size in bytes, mtime in ns or an ETag string).
Signature = tuple[int, Any]
#: (shard, its signature) -> (members or None, damage or None): the walk of one shard.
WalkFn = Callable[[str], tuple[Members, TarFormatError | None]]


def local_signature(path: str) -> Signature:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def walk_local(path: str, keep: Callable[[str], bool] | None = None
               ) -> tuple[Members, TarFormatError | None]:
    """The members of a local shard (and the damage that ended the walk early, if any);
    ``keep``: see :func:`~gpufeed.sources._tar_walk.walk`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"tar shard {path!r} does not exist") from None
    try:
        size = os.fstat(fd).st_size
        try:
            return walk(local_reader(fd), size, path, keep), None
        except TarFormatError as exc:
            return exc.members, exc
    finally:
        os.close(fd)


def build(shards: list[str], signatures: list[Signature], options: dict[str, Any],
          walk_fn: WalkFn, index_cache: str | None, threads: int) -> list[ShardIndex]:
    """Every shard's index, from ``index_cache`` where a shard is unchanged, else walked
    (``threads`` shards at once); rewrites ``index_cache`` if anything was walked."""
    cached = _load(index_cache, options) if index_cache is not None else {}
    out: list[ShardIndex | None] = []
    todo = []
    for i, (shard, sig) in enumerate(zip(shards, signatures)):
        hit = cached.get(shard)
        if hit is not None and hit[0] == list(sig):
            out.append(hit[1])
        else:
            out.append(None)
            todo.append(i)

    def one(i: int) -> ShardIndex:
        members, damage = walk_fn(shards[i])
        return index_shard(members, shards[i], options["image_extensions"], options["label_fn"],
                           options["on_error"], damage)

    if todo:
        with ThreadPoolExecutor(max(1, min(threads, len(todo))),
                                thread_name_prefix="gpufeed-tar-index") as ex:
            for i, index in zip(todo, ex.map(one, todo)):
                out[i] = index
        if index_cache is not None and all(ix.target_kind != "pickle" for ix in out):  # type: ignore[union-attr]
            _save(index_cache, options, shards, signatures, out)  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _meta(options: dict[str, Any]) -> dict[str, Any]:
    return {"format": CACHE_FORMAT, "version": VERSION,
            "image_extensions": list(options["image_extensions"]), "label": options["label"],
            "on_error": options["on_error"], "key_rule": KEY_RULE, "target_rule": TARGET_RULE}


def _load(path: str, options: dict[str, Any]) -> dict[str, tuple[list[Any], ShardIndex]]:
    """shard -> (signature, index) from the cache file (empty if none, stale or invalid)."""
    if not os.path.exists(path):
        return {}
    try:
        arrays, meta = read_npz(path, CACHE_FORMAT, VERSION)
        shards = meta.pop("shards")
        if meta != _meta(options):
            logger.info("tar index cache %s was built with other options: indexing again", path)
            return {}
        key_blob, key_offsets = arrays["keys"], arrays["key_offsets"]
        total = sum(int(s["count"]) for s in shards)
        if (key_offsets.shape != (total + 1,) or arrays["offsets"].shape != (total,)
                or arrays["labels"].shape != (total,) or arrays["sizes"].shape != (total,)):
            raise ValueError(f"arrays do not hold the {total} samples the shards list")
        targets, target_offsets = arrays["targets"], arrays["target_offsets"]
        out = {}
        start = tstart = 0
        for s in shards:
            end = start + int(s["count"])
            cut = key_offsets[start:end + 1]
            index = ShardIndex(
                key_blob[cut[0]:cut[-1]], np.diff(cut), arrays["offsets"][start:end],
                arrays["sizes"][start:end], arrays["exts"][start:end],
                arrays["labels"][start:end], dict(s["skipped"]))
            if s["target_kind"] == "member":
                tcut = target_offsets[tstart:tstart + len(index) + 1]
                index.target_kind, index.target_blob = "member", targets[tcut[0]:tcut[-1]]
                index.target_lens = np.diff(tcut)
                tstart += len(index)
            out[s["url"]] = (s["signature"], index)
            start = end
        return out
    except _LOAD_ERRORS as exc:
        warnings.warn(f"tar index cache {path!r} is not a valid {CACHE_FORMAT} v{VERSION} file "
                      f"({type(exc).__name__}: {str(exc)[:200]}); ignoring it, indexing again "
                      f"and rewriting it", IndexCacheWarning, stacklevel=5)
        return {}


def key_table(indexes: list[ShardIndex]) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 key bytes concatenated, int64 offsets with one more entry) of every sample."""
    lens = _cat([ix.key_lens for ix in indexes], np.int64)
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return _cat([ix.key_blob for ix in indexes], np.uint8), offsets


def _save(path: str, options: dict[str, Any], shards: list[str], signatures: list[Signature],
          indexes: list[ShardIndex]) -> None:
    meta = _meta(options)
    meta["shards"] = [{"url": s, "signature": list(sig), "count": len(ix), "skipped": ix.skipped,
                       "target_kind": ix.target_kind} for s, sig, ix in zip(shards, signatures, indexes)]
    members = [ix for ix in indexes if ix.target_kind == "member"]
    target_lens = _cat([ix.target_lens for ix in members], np.int64)
    target_offsets = np.zeros(len(target_lens) + 1, np.int64)
    np.cumsum(target_lens, out=target_offsets[1:])
    blob, offsets = key_table(indexes)
    arrays = {"meta": meta_array(meta),
              "keys": blob, "key_offsets": offsets,
              "offsets": _cat([ix.offsets for ix in indexes], np.int64),
              "sizes": _cat([ix.sizes for ix in indexes], np.int64),
              "exts": _cat([ix.exts for ix in indexes], np.uint8),
              "labels": _cat([ix.labels for ix in indexes], np.int64),
              "targets": _cat([ix.target_blob for ix in members], np.uint8), "target_offsets": target_offsets}
    write_npz(path, arrays, "the tar index cache")


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


# -- sidecars ------------------------------------------------------------------------------
def sidecar_arrays(members: Members, shard_bytes: int) -> dict[str, np.ndarray]:
    """The arrays of a sidecar file for ``members`` of a shard of ``shard_bytes`` bytes."""
    names = [n.encode("utf-8", "surrogateescape") for n in members.names]
    name_offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(n) for n in names], out=name_offsets[1:])
    small_offsets = np.full((len(names), 2), -1, np.int64)
    parts, pos = [], 0
    for i in range(len(names)):
        data = members.small.get(i)
        if data is not None:
            small_offsets[i] = (pos, pos + len(data))
            parts.append(data)
            pos += len(data)
    meta = {"format": SIDECAR_FORMAT, "version": VERSION, "shard_bytes": int(shard_bytes)}
    offsets, sizes = members.as_arrays()
    return {"meta": meta_array(meta),
            "names": np.frombuffer(b"".join(names), np.uint8), "name_offsets": name_offsets,
            "offsets": offsets, "sizes": sizes,
            "small": np.frombuffer(b"".join(parts), np.uint8), "small_offsets": small_offsets}


def read_sidecar(data: bytes, shard_bytes: int) -> Members | None:
    """The members a sidecar file's bytes list, or None if it is not one for a shard of
    ``shard_bytes`` bytes."""
    import io

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays["meta"].tobytes())
        if (meta.get("format") != SIDECAR_FORMAT or meta.get("version") != VERSION
                or meta.get("shard_bytes") != shard_bytes):
            return None
        blob, cut = arrays["names"].tobytes(), arrays["name_offsets"].tolist()
        small, spans = arrays["small"].tobytes(), arrays["small_offsets"].tolist()
        members = Members([blob[cut[i]:cut[i + 1]].decode("utf-8", "surrogateescape")
                           for i in range(len(cut) - 1)],
                          arrays["offsets"].tolist(), arrays["sizes"].tolist())
        members.small = {i: small[a:b] for i, (a, b) in enumerate(spans) if a >= 0}
        return members
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        logger.warning("ignoring a tar sidecar index that cannot be read (%s)", exc)
        return None
