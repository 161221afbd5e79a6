"""ImageFolder: torchvision's ``ImageFolder`` indexing, stored in numpy arrays."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gpufeed.sources._base import ImageSource
from gpufeed.sources._paths import PathTable, labels_array

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
         extensions: tuple[str, ...] = IMG_EXTENSIONS) -> tuple[list[str], list[int]]:
    """(paths after ``os.path.join(root, "")``, labels), in torchvision's ``make_dataset`` order.

    Files are matched by extension (case-insensitive), class folders walked recursively
    (following links), directories and files sorted. Raises FileNotFoundError naming the
    classes without a single image, as torchvision does.
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
                if filename.lower().endswith(extensions):
                    paths.append(os.path.join(dirpath, filename)[len(prefix):])
                    labels.append(target)
        if len(paths) == before:
            empty.append(name)
    if empty:
        shown = ", ".join(repr(e) for e in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise FileNotFoundError(f"no image files in class folder(s) {shown} of {root!r}; looked "
                                f"for extensions {', '.join(extensions)} (case-insensitive)")
    return paths, labels


class ImageFolder(ImageSource):
    """Images in ``root/CLASS/.../FILE``, indexed exactly as ``torchvision.datasets.ImageFolder``.

    ``classes``, ``class_to_idx``, ``samples`` and ``targets`` match torchvision's; paths and
    labels are kept in numpy arrays (``samples`` builds its list on demand).
    """

    def __init__(self, root: str | os.PathLike, transform: Any | None = None) -> None:
        self.root = os.fspath(root)
        self._prefix = os.path.join(self.root, "")
        self.transform = transform
        self.classes, self.class_to_idx = find_classes(self.root)
        paths, labels = scan(self.root, self.class_to_idx)
        self._paths = PathTable(paths)
        self._labels = labels_array(labels)

    def __len__(self) -> int:
        return len(self._labels)

    def path(self, index: int) -> str:
        """Full path of sample ``index``."""
        return self._prefix + self._paths[index]

    def read(self, index: int) -> bytes:
        with open(self.path(index), "rb") as f:
            return f.read()

    def label(self, index: int) -> int:
        return int(self._labels[index])

    def describe(self, index: int) -> str:
        return self.path(index)

    @property
    def labels(self) -> np.ndarray:
        """All labels, int64 (read-only)."""
        return self._labels

    @property
    def targets(self) -> list[int]:
        """All labels as a list, as torchvision's ``targets``."""
        return self._labels.tolist()

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
