"""ImageDataset: gpufeed's image path over an existing dataset of (path or bytes, target)."""

from __future__ import annotations

import os
from typing import Any

from gpufeed.errors import shorten
from gpufeed.sources._base import DEFAULT_READ_CONCURRENCY, ImageSource
from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES
from gpufeed.sources._remote import RemoteOptions, RemoteReader, is_url, read_concurrency_for

_BYTES = (bytes, bytearray, memoryview)


class ImageDataset(ImageSource):
    """Wrap ``source`` so gpufeed decodes its images.

    ``source`` is either

    - an object with a ``samples`` list of ``(path, target)`` (e.g. a torchvision
      ``ImageFolder``/``DatasetFolder``), or a list/tuple of such pairs: the pairs are copied
      (paths into numpy arrays, int targets into an int64 array) and ``source`` is not kept;
      ``classes``/``class_to_idx`` are copied if present;
    - any map-style dataset whose items are ``(path or encoded bytes, target)``: items are
      fetched from it on each read, one ``source[i]`` per sample.

    A target may be any picklable object (an int class index, a float, a string, a tuple, a dict,
    a tensor...): the loader's image path batches targets exactly as ``DataLoader``'s
    ``default_collate`` does. When every target of a ``samples`` list is an ``int``, they are
    batched as int64 labels straight into the batch (:attr:`int_targets`); a wrapped dataset's
    targets are collated in the workers.

    ``read_concurrency``: reads in flight per worker (see :class:`ImageSource`). A wrapped
    dataset reads one sample at a time by default (its code need not be thread-safe); on slow
    storage ask for more (``ImageDataset(ds, read_concurrency=16)``), its ``__getitem__`` must
    then be thread-safe. A ``samples`` list of local paths is automatic by default, as
    :class:`ImageFolder`: one read at a time until reads stall the worker, then read-ahead.
    ``read_budget_bytes`` bounds the bytes read and not yet decoded per worker.

    Paths may be URLs (``s3://``, ``gs://``, ``http(s)://``, any fsspec protocol;
    ``pip install gpufeed[remote]``), read with ``storage_options`` (fsspec's filesystem
    options) and ``remote_options`` (:class:`RemoteOptions`: timeout, retries). A ``samples``
    list of URLs reads 16 at a time per worker by default.
    """

    def __init__(self, source: Any, transform: Any | None = None,
                 target_transform: Any | None = None, *, read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES,
                 storage_options: dict[str, Any] | None = None,
                 remote_options: RemoteOptions | None = None) -> None:
        self.transform = transform
        self.target_transform = target_transform
        self.classes = list(getattr(source, "classes", []) or [])
        self.class_to_idx = dict(getattr(source, "class_to_idx", {}) or {})
        pairs = getattr(source, "samples", None)
        if pairs is None and isinstance(source, (list, tuple)) and not _holds_bytes(source):
            pairs = source  # (path, label) pairs; a list of (bytes, label) is read as a dataset
        self._source: Any = None
        if pairs is not None:
            pairs = list(pairs)
            for pair in pairs[:1] + pairs[-1:]:  # spot checks; a full pass would be slow
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                        and isinstance(pair[0], (str, os.PathLike))):
                    raise TypeError(f"`source.samples` must be a list of (path, class_index). "
                                    f"Found: {shorten(pair)}.")
            self._paths: PathTable | None = PathTable(p for p, _ in pairs)
            targets = [c for _, c in pairs]
            self.int_targets = all(type(c) is int for c in targets)
            self._labels = labels_array(targets) if self.int_targets else labels_array([])
            self._targets: list[Any] | None = None if self.int_targets else targets
            self._count = len(targets)
        elif hasattr(source, "__getitem__") and hasattr(source, "__len__"):
            self._source = source
            self._paths = None
            self.int_targets = False  # known only item by item: collated in the workers
        else:
            raise TypeError(f"`source` must be a map-style dataset of (path or bytes, label) or "
                            f"have a `samples` list. Found: {type(source).__name__}.")
        self.remote = RemoteReader(storage_options, remote_options)  # used for URL paths only
        first = self._paths[0] if self._paths is not None and len(self._paths) else None
        urls = is_url(first)
        if is_url(first):
            self.remote.filesystem(first)  # fsspec and the protocol's package: checked now
        self.set_read_options(read_concurrency_for(urls, read_concurrency, DEFAULT_READ_CONCURRENCY
                                                   if self._paths is not None else 1),
                              read_budget_bytes)

    def __len__(self) -> int:
        return self._count if self._paths is not None else len(self._source)

    def _item(self, index: int) -> tuple[Any, Any]:
        item = self._source[index]
        if not (isinstance(item, (tuple, list)) and len(item) >= 2
                and isinstance(item[0], (str, os.PathLike) + _BYTES)):
            raise TypeError(f"items of the wrapped dataset must be (path or encoded bytes, target). "
                            f"Found at index {index}: {type(item).__name__} "
                            f"{shorten(item)}.")
        return item[0], item[1]

    def read_item(self, index: int) -> tuple[Any, Any]:
        if self._paths is not None:
            return self.read(index), self.target(index)
        what, target = self._item(index)
        return (self._read_path(what, index) if isinstance(what, (str, os.PathLike)) else what), target

    def read(self, index: int) -> Any:
        if self._paths is not None:
            return self._read_path(self._paths[index], index)
        return self.read_item(index)[0]

    def _read_path(self, path: str | os.PathLike, index: int) -> bytes:
        if is_url(path):
            return self.remote.read(path, index)
        with open(path, "rb") as f:
            return f.read()

    def target(self, index: int) -> Any:
        """The target of sample ``index``, as given."""
        if self._paths is None:
            return self._item(index)[1]
        if self._targets is not None:
            return self._targets[index]
        return int(self._labels[index])

    def label(self, index: int) -> int:
        """The target of sample ``index`` as an int (a TypeError where it is not a number)."""
        return int(self.target(index))

    def describe(self, index: int) -> str:
        if self._paths is not None:
            return self._paths[index]
        try:
            what = self._source[index][0]
        except Exception:  # noqa: BLE001 - only names the sample; the real error is raised later
            what = None
        if isinstance(what, (str, os.PathLike)):
            return os.fspath(what)
        return f"{type(self._source).__name__}[{index}]"

    @property
    def samples(self) -> list[tuple[str, Any]]:
        """[(path, target), ...] when built from paths (on each access)."""
        if self._paths is None:
            raise AttributeError("this ImageDataset wraps a dataset of items, not a samples list")
        paths = self._paths
        return [(paths[i], self.target(i)) for i in range(len(paths))]


def _holds_bytes(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether ``items`` starts with an (encoded bytes, label) pair."""
    first = items[0] if items else None
    return isinstance(first, (tuple, list)) and len(first) >= 1 and isinstance(first[0], _BYTES)
