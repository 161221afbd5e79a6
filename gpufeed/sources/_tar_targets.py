"""Tar shards' targets: a member decoded as webdataset decodes it, or a function's result.

``label="EXT"`` takes the sample's ``.EXT`` member (a small one, read during the index walk) and
decodes it as webdataset's basic handlers do (``webdataset.autodecode.basichandlers``):
``cls``, ``cls2``, ``class``, ``count``, ``index``, ``inx``, ``id``: an int; ``txt``, ``text``,
``transcript``: a str (UTF-8); ``json``, ``jsn``: the parsed JSON object; any other extension:
the member's bytes. ``label=FUNCTION`` keeps whatever the function returns (any picklable
object). Int targets are kept in one int64 array (the loader batches them as int64 labels); any
others are kept as bytes in one blob (the member's bytes, or the pickled result), with their
offsets, and decoded on each access (``TargetTable``).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpufeed.sources._shared import share

INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
#: A name for the decoding rule above, kept in index caches: one built by another rule is redone.
TARGET_RULE = "webdataset-basic-1"

#: How a shard's targets are kept: ints in the int64 labels ("int"), the members' bytes
#: ("member"), pickled function results ("pickle").
KINDS = ("int", "member", "pickle")


def int_label(label: Any) -> bool:
    """Whether a label spec gives int targets by itself (None: -1; an int extension)."""
    return label is None or (isinstance(label, str) and label in INT_EXTENSIONS)


def describe_rule(ext: str) -> str:
    """What ``decode_member`` makes of a member with extension ``ext``, for messages."""
    if ext in INT_EXTENSIONS:
        return "an integer"
    if ext in TEXT_EXTENSIONS:
        return "UTF-8 text"
    return "JSON" if ext in JSON_EXTENSIONS else "bytes"


def decode_member(ext: str, raw: bytes) -> Any:
    """A small member's bytes as the target webdataset's basic handlers make of them."""
    if ext in INT_EXTENSIONS:
        return int(raw)
    if ext in TEXT_EXTENSIONS:
        return raw.decode("utf-8")
    if ext in JSON_EXTENSIONS:
        return json.loads(raw)
    return bytes(raw)


def blob_of(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 blob of ``items`` concatenated, int64 lengths)."""
    return (np.frombuffer(b"".join(items), np.uint8).copy(),
            np.fromiter(map(len, items), np.int64, len(items)))


def pickled(values: Sequence[Any]) -> list[bytes]:
    return [pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for v in values]


class TargetTable:
    """The non-int targets of a ``TarShards``: a uint8 blob, int64 offsets (one more than the
    samples), and how to decode one (``kind`` "member" with the extension, or "pickle")."""

    def __init__(self, kind: str, ext: str | None, blob: np.ndarray, offsets: np.ndarray) -> None:
        self.kind, self.ext, self.blob, self.offsets = kind, ext, blob, offsets

    def __getitem__(self, index: int) -> Any:
        raw = self.blob[int(self.offsets[index]):int(self.offsets[index + 1])].tobytes()
        if self.kind == "pickle":
            return pickle.loads(raw)  # made by this process's index, never read from a file
        assert self.ext is not None
        return decode_member(self.ext, raw)


def target_table(indexes: Sequence[Any], ext: str | None) -> TargetTable | None:
    """The targets of every shard's samples (``ShardIndex`` objects, in order) when any shard
    keeps others than ints, else None (the int64 labels hold them all). Shards of int targets
    beside shards of pickled ones are pickled too (a label function's results may differ by
    shard)."""
    kinds = {ix.target_kind for ix in indexes if len(ix)}
    if kinds <= {"int"}:
        return None
    kind = "pickle" if "pickle" in kinds else "member"
    blobs, lens = [], []
    for ix in indexes:
        if not len(ix):
            continue
        if ix.target_kind == kind:
            blobs.append(ix.target_blob)
            lens.append(ix.target_lens)
        else:  # int targets among pickled ones
            blob, lengths = blob_of(pickled(ix.labels.tolist()))
            blobs.append(blob)
            lens.append(lengths)
    offsets = np.zeros(sum(len(x) for x in lens) + 1, np.int64)
    if lens:
        np.cumsum(np.concatenate(lens), out=offsets[1:])
    blob = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
    return TargetTable(kind, ext, share(blob.astype(np.uint8, copy=False)), share(offsets))
