"""Tar shards' index: shard URL patterns, WebDataset key grouping, labels, per-shard tables.

Grouping follows webdataset (``webdataset.tariterators.group_by_keys``): a member name
``DIR/KEY.EXT`` splits at the first dot of its last path component into the key ``DIR/KEY``
and the extension ``EXT`` (lower-cased); a last component starting with a dot joins the key
``DIR/`` (see :func:`split_name`); consecutive members with the same key form one sample;
names without a dot in their last component, and names starting with ``__...__`` (metadata),
are passed over.
Unlike webdataset, a key seen again later in the same shard, or an extension twice in one
sample, is an error (``"duplicate-key"``): webdataset would yield two samples, or stop.

Each sample's image is its first member whose extension is in ``image_extensions``; its target
is the integer text of the ``.cls`` member by default (``label="EXT"`` for another member,
decoded as webdataset decodes it: ``gpufeed.sources._tar_targets``), the result of a function
of the sample's small members (``label=callable``), or -1 with ``label=None``. Problems are
reasons: ``"no-image"``, ``"no-label"``, ``"bad-label"``, ``"duplicate-key"``,
``"truncated"``, ``"not-a-tar"``; with ``on_error="raise"`` the first one
raises a ValueError naming the shard, the member and its byte offset, with ``"skip"`` the
sample (or the damaged rest of a shard) is left out and counted.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufeed.sources._remote import is_url
from gpufeed.sources._tar_targets import INT_EXTENSIONS, blob_of, decode_member, describe_rule, int_label, pickled
from gpufeed.sources._tar_walk import Members, TarFormatError

DEFAULT_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
REASONS = ("no-image", "no-label", "bad-label", "duplicate-key", "truncated", "not-a-tar")
LabelSpec = str | Callable[[dict[str, Any]], Any] | None
_NO_LABEL = object()  # _label's answer after reporting a problem

_META = re.compile(r"__[^/]*__($|/)")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> a-000.tar, a-001.tar, a-002.tar (zero-padded to the first
    bound's width); ``{x,y}`` -> x, y; several braces expand left to right."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    rng = _RANGE.match(body)
    if rng is not None:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        width = len(rng.group(1)) if rng.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        options = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:
        options = ["{" + body + "}"]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [head + option + rest for option in options for rest in expand_braces(tail)]


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths or URLs from a list, a brace pattern or a glob (local paths), in order.

    A glob that matches nothing, and a result with no shard, are FileNotFoundError/ValueError.
    """
    items: Iterable[Any] = ([urls] if isinstance(urls, (str, os.PathLike)) else urls)
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"`urls` must be a path, a URL, a brace or glob pattern, or a list "
                            f"of them. Found an item {type(item).__name__} {item!r:.80}.")
        for path in expand_braces(os.fspath(item)):
            if not is_url(path) and glob.has_magic(path):
                matched = sorted(glob.glob(path))
                if not matched:
                    raise FileNotFoundError(f"no tar shard matches {path!r}")
                out.extend(matched)
            else:
                out.append(path)
    if not out:
        raise ValueError(f"`urls` names no tar shard. Found: {urls!r:.200}.")
    return out


def split_name(name: str) -> tuple[str, str] | None:
    """(key, lower-cased extension) of a member name, or None for one webdataset passes over.

    webdataset's rule: the key is the name up to a split point (the start, or just after a
    slash with no newline before it; the latest such point first), followed by at least one
    character up to the first dot after it; the extension is everything after that dot, and
    must hold no slash. So ``DIR/KEY.EXT`` -> (``DIR/KEY``, ``EXT``), and a last component
    starting with a dot, ``DIR/.EXT``, belongs to the key ``DIR/`` when the component before it
    has no dot (``.EXT`` alone, or ``A.B/.EXT``, is passed over).
    """
    if name.startswith("__") and _META.match(name):
        return None
    newline = name.find("\n")
    end = len(name) if newline < 0 else newline
    while True:
        slash = name.rfind("/", 0, end)
        start = slash + 1
        dot = name.find(".", start)
        if dot > start and "/" not in name[dot + 1:]:
            return name[:dot], name[dot + 1:].lower()
        if slash < 0:
            return None
        end = slash


#: A name for the grouping rule above, kept in index caches: one built by another rule is redone.
KEY_RULE = "webdataset-1.0"


@dataclass
class ShardIndex:
    """The samples of one shard: keys, image data offsets and sizes, image extension codes
    (into ``image_extensions``), labels; and what was left out, by reason."""

    key_blob: np.ndarray  # uint8: the UTF-8 keys, concatenated
    key_lens: np.ndarray  # int64: each key's length in bytes
    offsets: np.ndarray
    sizes: np.ndarray
    exts: np.ndarray
    labels: np.ndarray  # int64 targets (-1 where ``target_kind`` is not "int")
    skipped: dict[str, int] = field(default_factory=dict)
    # Targets of other kinds (``gpufeed.sources._tar_targets``): "int" (in ``labels``),
    # "member" (each sample's label member, bytes) or "pickle" (pickled function results),
    # concatenated in ``target_blob`` with their lengths in ``target_lens``.
    target_kind: str = "int"
    target_blob: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    target_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.key_lens)

    @property
    def keys(self) -> list[str]:
        """The keys as strings (builds Python objects: for inspection)."""
        blob, out, pos = self.key_blob.tobytes(), [], 0
        for n in self.key_lens.tolist():
            out.append(blob[pos:pos + n].decode("utf-8", "surrogateescape"))
            pos += n
        return out


class TarIndexError(ValueError):
    """A shard's content cannot be indexed (names the shard, the member, its byte offset)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def label_name(label: LabelSpec) -> str | None:
    """A stable name of a label spec, for the index cache (a function: its qualified name)."""
    if label is None or isinstance(label, str):
        return label
    module = getattr(label, "__module__", "?")
    return f"{module}.{getattr(label, '__qualname__', type(label).__qualname__)}"


def index_shard(members: Members, shard: str, image_extensions: tuple[str, ...],
                label: LabelSpec, on_error: str, damage: TarFormatError | None = None
                ) -> ShardIndex:
    """Group ``members`` (of ``shard``) into samples; ``damage``: the walk's error, if the
    shard is damaged after these members (raised with "raise", counted with "skip")."""
    skipped: dict[str, int] = {}

    def problem(reason: str, message: str) -> None:
        if on_error == "raise":
            raise TarIndexError(message + " Or pass on_error='skip' to TarShards to leave such "
                                          "samples out (they are counted).", reason)
        skipped[reason] = skipped.get(reason, 0) + 1

    if damage is not None and damage.reason == "not-a-tar":
        problem("not-a-tar", str(damage) + ".")
        return _empty(skipped)
    keys: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    exts: list[int] = []
    labels: list[Any] = []
    seen: set[str] = set()
    groups = _groups(members)
    for key, parts in groups:
        by_ext: dict[str, int] = {}
        duplicate = key in seen
        for ext, i in parts:
            duplicate = duplicate or ext in by_ext
            by_ext.setdefault(ext, i)
        seen.add(key)
        if duplicate:
            problem("duplicate-key", f"duplicate key: {_where(members, shard, key, parts)} "
                                     f"repeats a key or a member name seen before in this "
                                     f"shard. Give every sample its own key.")
            continue
        image = next((i for i, ext in enumerate(image_extensions) if ext in by_ext), None)
        if image is None:
            problem("no-image", f"no image in {_where(members, shard, key, parts)}: its members "
                                f"are {sorted(by_ext)}, none of image_extensions "
                                f"{list(image_extensions)}. Pass image_extensions= to match.")
            continue
        value = _label(members, by_ext, key, label,
                       functools.partial(_where, members, shard, key, parts), problem)
        if value is _NO_LABEL:
            continue
        member = by_ext[image_extensions[image]]
        keys.append(key)
        offsets.append(members.offsets[member])
        sizes.append(members.sizes[member])
        exts.append(image)
        labels.append(value)
    if damage is not None:
        problem("truncated", str(damage))
    encoded = [k.encode("utf-8", "surrogateescape") for k in keys]
    index = ShardIndex(np.frombuffer(b"".join(encoded), np.uint8),
                       np.fromiter(map(len, encoded), np.int64, len(encoded)),
                       np.asarray(offsets, np.int64), np.asarray(sizes, np.int64),
                       np.asarray(exts, np.uint8), np.full(len(labels), -1, np.int64), skipped)
    return with_targets(index, labels, label)


def with_targets(index: ShardIndex, values: list[Any], label: LabelSpec) -> ShardIndex:
    """``index`` holding ``values``, its samples' targets: int64 labels when the spec gives ints
    (or a function gave nothing but ints), else bytes in the target blob."""
    if int_label(label) or all(type(v) is int for v in values):
        index.labels = np.asarray(values, np.int64)
        return index
    kind = "member" if isinstance(label, str) else "pickle"
    index.target_kind = kind
    index.target_blob, index.target_lens = blob_of(values if kind == "member" else pickled(values))
    return index


def _where(members: Members, shard: str, key: str, parts: list[tuple[str, int]]) -> str:
    first = parts[0][1]
    return (f"sample {key!r} (member {members.names[first]!r}, header at byte offset "
            f"{members.header_offset(first)}) of tar shard {shard!r}")


def _empty(skipped: dict[str, int]) -> ShardIndex:
    z = np.zeros(0, np.int64)
    return ShardIndex(np.zeros(0, np.uint8), z, z.copy(), z.copy(), np.zeros(0, np.uint8),
                      z.copy(), skipped)


def _groups(members: Members) -> list[tuple[str, list[tuple[str, int]]]]:
    """[(key, [(extension, member number), ...]), ...] for consecutive members of one key."""
    out: list[tuple[str, list[tuple[str, int]]]] = []
    for i, name in enumerate(members.names):
        split = split_name(name)
        if split is None:
            continue
        key, ext = split
        if out and out[-1][0] == key:
            out[-1][1].append((ext, i))
        else:
            out.append((key, [(ext, i)]))
    return out


def _what(ext: str) -> str:
    rule = describe_rule(ext)
    return rule if ext in INT_EXTENSIONS else f"a small member that decodes as {rule}"


def _label(members: Members, by_ext: dict[str, int], key: str, label: LabelSpec,
           where_fn: Callable[[], str], problem: Callable[[str, str], None]) -> Any:
    """The sample's target (a label member's bytes where its extension is not an int one), or
    ``_NO_LABEL`` after reporting a problem."""
    if label is None:
        return -1
    if isinstance(label, str):
        member = by_ext.get(label)
        if member is None:
            problem("no-label", f"no label in {where_fn()}: no .{label} member (found "
                                f"{sorted(by_ext)}). Pass label=None for unlabelled samples, or "
                                f"label=FUNCTION to compute one.")
            return _NO_LABEL
        raw = members.small.get(member)
        try:
            if raw is None:
                raise ValueError(f"{members.sizes[member]} bytes, not a small member")
            if label not in INT_EXTENSIONS:
                decode_member(label, raw)  # checked now; kept as bytes, decoded on each access
                return bytes(raw)
            return int(raw.decode("utf-8").strip())
        except ValueError as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
            problem("bad-label", f"bad label in {where_fn()}: member {members.names[member]!r} at "
                                 f"byte offset {members.offsets[member]} holds "
                                 f"{(raw or b'')[:40]!r}, not {_what(label)} ({exc}).")
            return _NO_LABEL
    sample: dict[str, Any] = {"__key__": key}
    for ext, i in by_ext.items():
        if i in members.small:
            sample[ext] = members.small[i]
    try:
        return label(sample)
    except Exception as exc:  # noqa: BLE001 - the user's function: reported with where it ran
        problem("bad-label", f"label function failed on {where_fn()}: {type(exc).__name__}: "
                             f"{str(exc)[:200]}. It is given a dict of the sample's small "
                             f"members (bytes, by extension) and '__key__', and returns the "
                             f"sample's target (any picklable object).")
        return _NO_LABEL
