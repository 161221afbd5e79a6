"""ImageFolder: torchvision's ``ImageFolder`` indexing, stored in numpy arrays."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpufeed.sources._base import DEFAULT_READ_CONCURRENCY, ImageSource, LabelArray
from gpufeed.sources._index_cache import build_index
from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES
from gpufeed.sources._remote import RemoteOptions, RemoteReader, read_concurrency_for, remote_root
from gpufeed.sources._scan import empty_classes_error

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """Class folder names of ``root``, sorted, and their indices (torchvision's rule)."""
    try:
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    except FileNotFoundError:
        raise FileNotFoundError(f"image folder root {root!r} does not exist; expected "
                                f"ROOT/CLASS_NAME/IMAGE files") from None
    except NotADirectoryError:
        raise NotADirectoryError(f"image folder root {root!r} is not a directory; expected "
                                 f"ROOT/CLASS_NAME/IMAGE files") from None
    if not classes:
        raise FileNotFoundError(f"no class folders found in {root!r}; expected "
                                f"ROOT/CLASS_NAME/IMAGE files")
    return classes, {name: i for i, name in enumerate(classes)}


def scan(root: str, class_to_idx: dict[str, int],
         extensions: tuple[str, ...] = IMG_EXTENSIONS,
         is_valid_file: Callable[[str], bool] | None = None,
         allow_empty: bool = False) -> tuple[list[str], list[int]]:
    """(paths after ``os.path.join(root, "")``, labels), in torchvision's ``make_dataset`` order.

    Files are matched by extension (case-insensitive), or, when ``is_valid_file`` is given, by
    ``is_valid_file(full_path)`` alone (as torchvision's ``ImageFolder``); class folders are
    walked recursively (following links), directories and files sorted. Unless ``allow_empty``,
    raises FileNotFoundError naming the classes without a single image, as torchvision does.
    """
    prefix = os.path.join(root, "")  # every path is prefix + rest: store only the rest
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for name in sorted(class_to_idx, key=class_to_idx.__getitem__):
        target = class_to_idx[name]
        folder = os.path.join(root, name)
        before = len(paths)
        for dirpath, _, filenames in sorted(os.walk(folder, followlinks=True)):
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if (filename.lower().endswith(extensions) if is_valid_file is None
                        else is_valid_file(path)):
                    paths.append(path[len(prefix):])
                    labels.append(target)
        if len(paths) == before:
            empty.append(name)
    if empty and not allow_empty:
        raise empty_classes_error(root, empty, extensions, is_valid_file)
    return paths, labels


class ImageFolder(LabelArray, ImageSource):
    """Images in ``root/CLASS/.../FILE``, indexed exactly as ``torchvision.datasets.ImageFolder``.

    ``classes``, ``class_to_idx``, ``samples`` and ``targets`` match torchvision's; paths and
    labels are kept in numpy arrays (``samples`` builds its list on demand).

    The arguments are torchvision's. ``transform``: see :class:`ImageSource` (a gpufeed transform
    for the fast path, or any callable taking a PIL image). ``target_transform`` is called on
    the label. ``loader`` (path -> image, e.g. torchvision's ``default_loader``) replaces
    gpufeed's decode in ``__getitem__`` and needs a callable ``transform`` or none.
    ``is_valid_file(path)``, if given, replaces the extension check. ``allow_empty=True`` keeps
    class folders without images (their class index stays assigned). ``read_concurrency`` and
    ``read_budget_bytes``: reads in flight per worker, see :class:`ImageSource`. Default: 16
    for a URL; automatic for a local root (each worker reads one sample at a time until its
    reads take at least half as long as its decoding, as on a network file system mounted as a
    local path, then reads ahead, 2 to 64 in flight from the measured latency). An int is kept
    as given (1: never read ahead).

    ``root`` may be a URL (``s3://bucket/train``, ``gs://...``, ``http(s)://...``, any fsspec
    protocol; ``pip install gpufeed[remote]``): the tree is listed and read through fsspec, with
    ``storage_options`` (fsspec's filesystem options: credentials, endpoint...) and
    ``remote_options`` (:class:`RemoteOptions`: timeout, retries); see
    :mod:`gpufeed.sources._remote`.

    A local tree's class folders are listed on threads (the order stays torchvision's).
    ``index_cache``: a file path where a local tree's index is kept between runs (a plain
    ``.npz``, not a pickle), reused while the tree is unchanged, rewritten otherwise.
    ``index_check``: how "unchanged" is decided: ``"directories"`` stats every directory (their
    modification times change whenever an entry is added, removed or renamed; recently modified
    ones are listed again), ``"files"`` also lists every directory and stats every file (sizes
    and times; slower than a scan on local disks). See the "Million-sample datasets" page of
    the docs.
    """

    #: The reader of a URL root (fsspec); None for a local root.
    remote: RemoteReader | None = None

    def __init__(self, root: str | os.PathLike, transform: Any | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 loader: Callable[[str], Any] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, *,
                 read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES,
                 storage_options: dict[str, Any] | None = None,
                 remote_options: RemoteOptions | None = None,
                 index_cache: str | os.PathLike | None = None,
                 index_check: str = "directories") -> None:
        for name, value in (("target_transform", target_transform), ("loader", loader),
                            ("is_valid_file", is_valid_file)):
            if value is not None and not callable(value):
                raise TypeError(f"`{name}` must be a callable or None. Found: "
                                f"{type(value).__name__} {value!r:.80}.")
        self.root = os.fspath(root)
        self.remote = remote_root(self.root, storage_options, remote_options, loader)
        self.set_read_options(read_concurrency_for(self.remote is not None, read_concurrency,
                                                   DEFAULT_READ_CONCURRENCY), read_budget_bytes)
        self._prefix = os.path.join(self.root, "")
        self.loader = loader  # before transform, which is checked against it
        self.transform = transform
        self.target_transform = target_transform
        self.index_cache = None if index_cache is None else os.fspath(index_cache)
        self.index_check = index_check
        if self.remote is not None:
            if self.index_cache is not None:
                raise ValueError(f"`index_cache` keeps the index of a local tree; {self.root!r} "
                                 f"is a URL. Drop index_cache, or copy the tree locally.")
            self.classes, paths, labels = self.remote.scan_folder(
                self.root, IMG_EXTENSIONS, is_valid_file, bool(allow_empty))
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
            self._paths, self._labels = PathTable(paths), labels_array(labels)
        else:
            self.classes, self.class_to_idx = find_classes(self.root)
            self._paths, self._labels = build_index(
                self.root, self.class_to_idx, IMG_EXTENSIONS, is_valid_file, bool(allow_empty),
                self.index_cache, index_check)

    def __len__(self) -> int:
        return len(self._labels)

    def path(self, index: int) -> str:
        """Full path of sample ``index``."""
        return self._prefix + self._paths[index]

    def read(self, index: int) -> bytes:
        if self.remote is not None:
            return self.remote.read(self.path(index), index)
        with open(self.path(index), "rb") as f:
            return f.read()

    def load_sample(self, index: int) -> tuple[Any, int]:
        if self.loader is not None:
            return self.loader(self.path(index)), self.label(index)
        return super().load_sample(index)

    def describe(self, index: int) -> str:
        return self.path(index)

    @property
    def samples(self) -> list[tuple[str, int]]:
        """[(path, class_index), ...] as torchvision's ``samples`` (built on each access)."""
        return [(self.path(i), int(c)) for i, c in enumerate(self._labels)]

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """Alias of :attr:`samples`, as in torchvision."""
        return self.samples

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(root={self.root!r}, {len(self)} images, "
                f"{len(self.classes)} classes, transform={self.transform!r})")
