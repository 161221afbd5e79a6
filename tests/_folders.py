"""Synthetic image folders for the tests: one written per distinct spec, shared by the tests that ask for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.synth import make_image_folder

Size = tuple[int, int] | tuple[tuple[int, int], tuple[int, int]]


class ImageFolders:
    """``folders(num_classes=, per_class=, size=, seed=) -> root`` of a torchvision-style folder
    written by :func:`gpufeed.synth.make_image_folder` (same arguments, same files).

    The same spec gives the same root every time: tests read it and never change it. A test or
    fixture that adds or changes files asks with ``private=True`` for a folder of its own.
    """

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._factory = tmp_path_factory
        self._made: dict[tuple[object, ...], Path] = {}

    def __call__(self, *, num_classes: int, per_class: int, size: Size = (350, 400), seed: int = 0,
                 fmt: str = "jpeg", private: bool = False) -> Path:
        key = (num_classes, per_class, size, seed, fmt)
        if not private and key in self._made:
            return self._made[key]
        root = self._factory.mktemp(f"images-{num_classes}x{per_class}-seed{seed}") / "images"
        make_image_folder(root, num_classes=num_classes, per_class=per_class, size=size, seed=seed, fmt=fmt)
        if not private:
            self._made[key] = root
        return root
