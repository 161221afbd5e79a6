"""A transform that is any callable (torchvision-style): called in workers on PIL images.

The callables here are module-level so that they pickle under any start method. Expected
tensors come from calling the same callable on the PIL image made here from gpufeed's decode.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gpufeed import FastLoader, GpufeedWarning, ImageDataset, ImageFolder, LMDBDataset, ResizeCenterCrop, pack
from gpufeed.decoders import decode
from gpufeed.synth import encode, photo_like

pytestmark = pytest.mark.timeout(60)

SIZE = (24, 20)  # (height, width)


def to_tensor_24x20(img):
    """A plain function: PIL resize, then HWC uint8 -> CHW tensor."""
    return torch.from_numpy(np.array(img.resize((SIZE[1], SIZE[0]), Image.BILINEAR))).permute(2, 0, 1)


class GrayThenTensor:
    """A small class-based callable with state, as torchvision's transforms are."""

    def __init__(self, side: int) -> None:
        self.side = side

    def __call__(self, img):
        assert isinstance(img, Image.Image) and img.mode == "RGB"
        small = img.convert("L").resize((self.side, self.side), Image.NEAREST)
        return torch.from_numpy(np.asarray(small, dtype=np.float32) / 255.0)[None]


def plus_hundred(label: int) -> int:
    return label + 100


@pytest.fixture(scope="module")
def root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=5, size=((40, 60), (50, 70)), seed=3)


def expected(ds: ImageFolder, fn, index: int) -> torch.Tensor:
    with open(ds.path(index), "rb") as f:
        return fn(Image.fromarray(decode(f.read()), "RGB"))


@pytest.mark.parametrize("fn", [to_tensor_24x20, GrayThenTensor(12)], ids=["function", "class"])
def test_getitem_calls_the_callable_on_a_pil_image(root, fn):
    ds = ImageFolder(root, transform=fn)
    assert ds.calls_transform
    for i in (0, len(ds) - 1):
        image, label = ds[i]
        assert torch.equal(image, expected(ds, fn, i))
        assert label == ds.targets[i]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fn", [to_tensor_24x20, GrayThenTensor(12)], ids=["function", "class"])
def test_loader_batches_equal_the_callable_applied_here(root, fn, num_workers):
    ds = ImageFolder(root, transform=fn, target_transform=plus_hundred)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = FastLoader(ds, batch_size=4, num_workers=num_workers)
    lines = [str(w.message) for w in caught if issubclass(w.category, GpufeedWarning)]
    assert len(lines) == 1 and "user callable" in lines[0], lines
    assert "generic path" in lines[0] and "ResizeCenterCrop / RandomResizedCrop" in lines[0]
    assert caught[0].filename == __file__  # it points at the FastLoader(...) call
    assert loader._image_feed is None
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    want = torch.stack([expected(ds, fn, i) for i in range(len(ds))])
    assert torch.equal(torch.cat(images), want)
    assert torch.cat(labels).tolist() == [t + 100 for t in ds.targets]


def test_target_transform_on_every_path(root, tmp_path):
    for transform in (None, ResizeCenterCrop(16, 20), to_tensor_24x20):
        ds = ImageFolder(root, transform=transform, target_transform=str)
        assert ds[len(ds) - 1][1] == str(ds.targets[-1])
    pack(root, tmp_path / "db.lmdb")
    lm = LMDBDataset(tmp_path / "db.lmdb", transform=to_tensor_24x20, target_transform=plus_hundred)
    wrapped = ImageDataset(ImageFolder(root), transform=to_tensor_24x20, target_transform=plus_hundred)
    for ds in (lm, wrapped):
        image, label = ds[0]
        assert image.shape == (3, *SIZE) and label == 100 + ImageFolder(root).targets[0]


def test_target_transform_runs_on_the_fast_path(root):
    ds = ImageFolder(root, transform=ResizeCenterCrop(16, 20), target_transform=plus_hundred)
    loader = FastLoader(ds, batch_size=4, channels_last=True)
    assert loader._image_feed is None  # made at the first iteration
    labels = torch.cat([y for _, y in loader])
    assert loader._image_feed is not None and loader._image_feed.plan.targets == "collate"
    assert labels.tolist() == [t + 100 for t in ds.targets]


def test_loader_replaces_the_decode(root):
    seen = []

    def load(path):
        seen.append(path)
        return Image.open(path).convert("RGB")

    ds = ImageFolder(root, transform=to_tensor_24x20, loader=load)
    image, _ = ds[3]
    assert seen == [ds.path(3)] and image.shape == (3, *SIZE)
    raw = ImageFolder(root, loader=load)
    assert isinstance(raw[0][0], Image.Image)  # no transform: the loader's result, as torchvision
    with pytest.raises(ValueError, match="cannot follow a `loader`"):
        ImageFolder(root, transform=ResizeCenterCrop(16), loader=load)


def test_is_valid_file_replaces_the_extension_check(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    jpeg = encode(photo_like(20, 30, seed=1))
    for name in ("a/keep_1.jpg", "a/drop_2.jpg", "a/keep_3.data", "b/keep_4.jpg"):
        (tmp_path / name).write_bytes(jpeg)
    seen = []

    def keep(path):
        seen.append(path)
        return os.path.basename(path).startswith("keep")

    ds = ImageFolder(tmp_path, is_valid_file=keep)
    assert [os.path.relpath(p, tmp_path) for p, _ in ds.samples] == [
        "a/keep_1.jpg", "a/keep_3.data", "b/keep_4.jpg"]  # any extension, as torchvision
    assert ds.targets == [0, 0, 1]
    assert str(tmp_path / "a" / "drop_2.jpg") in seen  # called with full paths


def test_allow_empty_keeps_empty_classes(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(encode(photo_like(8, 8)))
    (tmp_path / "c" / "y.jpg").write_bytes(encode(photo_like(8, 8)))
    with pytest.raises(FileNotFoundError, match="'b'.*allow_empty=True"):
        ImageFolder(tmp_path)
    ds = ImageFolder(tmp_path, allow_empty=True)
    assert ds.classes == ["a", "b", "c"] and ds.targets == [0, 2]
    with pytest.raises(FileNotFoundError, match="is_valid_file="):
        ImageFolder(tmp_path, is_valid_file=lambda p: p.endswith("x.jpg"))


@pytest.mark.parametrize("options", [{"normalize": ((0.5,) * 3, (0.2,) * 3)},
                                     {"dtype": torch.float32}, {"channels_last": True}])
def test_image_options_with_a_callable_are_a_clear_error(root, options):
    ds = ImageFolder(root, transform=to_tensor_24x20)
    with pytest.raises(ValueError) as info:
        FastLoader(ds, batch_size=4, num_workers=2, **options)
    message = str(info.value)
    assert f"`{next(iter(options))}`" in message
    assert "the transform is a user callable: to_tensor_24x20" in message
    assert "use gpufeed.ResizeCenterCrop / RandomResizedCrop for the fast path" in message


@pytest.mark.parametrize("bad", [3, "resize", [1, 2]])
def test_garbage_transform_is_a_type_error_naming_it(root, bad):
    with pytest.raises(TypeError, match=f"`transform` must be .*Found: {type(bad).__name__} "):
        ImageFolder(root, transform=bad)
    ds = ImageFolder(root)
    with pytest.raises(TypeError, match="`transform` must be"):
        ds.transform = bad
    with pytest.raises(TypeError, match="`target_transform` must be a callable"):
        ImageFolder(root, target_transform=5)


def test_missing_pillow_is_an_import_error_naming_the_extra(root, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ImportError, match=r"pip install gpufeed\[pil\]"):
        ImageFolder(root, transform=to_tensor_24x20)
    ImageFolder(root, transform=ResizeCenterCrop(16))  # the fast path needs no Pillow
