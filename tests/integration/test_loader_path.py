"""The path a loader takes, said three ways: one GpufeedWarning when a gpufeed image dataset's
loader takes the generic path, ``stats()["path"]`` / ``["path_reason"]``, and
``gpufeed.explain(loader)``."""

from __future__ import annotations

import warnings

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset, default_collate

import gpufeed
from gpufeed import FastLoader, GpufeedWarning, ImageFolder, ResizeCenterCrop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def root(image_folder):
    return image_folder(num_classes=2, per_class=3, size=(40, 48), seed=11)


def to_tensor(img):
    return torch.zeros(3, 4, 4)


def open_rgb(path):
    return Image.open(path).convert("RGB")


def keep_list(batch):
    return batch


# (what makes the loader take the generic path, words of the reason, words of the fix)
GENERIC = {
    "callable": (lambda root: (ImageFolder(root, transform=to_tensor), {}),
                 "the transform is a user callable: to_tensor", "ResizeCenterCrop / RandomResizedCrop"),
    "collate_fn": (lambda root: (ImageFolder(root, transform=ResizeCenterCrop(16)), {"collate_fn": keep_list}),
                   "a custom collate_fn is used (keep_list)", "drop it for the fast path"),
    "loader": (lambda root: (ImageFolder(root, loader=open_rgb), {"batch_size": None}),
               "has a `loader` (open_rgb)", "drop `loader`"),
    "no-transform": (lambda root: (ImageFolder(root), {"batch_size": None}),
                     "no transform", "transform=gpufeed.ResizeCenterCrop(224, 256)"),
    "batch_size-None": (lambda root: (ImageFolder(root, transform=ResizeCenterCrop(16)), {"batch_size": None}),
                        "batch_size=None disables batching", "give a batch_size"),
}


def build(root, name):
    make, reason, fix = GENERIC[name]
    dataset, kwargs = make(root)
    return dataset, {"batch_size": 2, **kwargs}, reason, fix


@pytest.mark.parametrize("name", list(GENERIC))
def test_the_generic_path_of_an_image_dataset_warns_once_per_loader_with_reason_and_fix(root, name):
    dataset, kwargs, reason, fix = build(root, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # not Python's once per place: every loader says it once
        loader = FastLoader(dataset, **kwargs)
        list(loader)
        list(loader)
        again = loader.replace()  # another loader: it says it again, once
        list(again)
    said = [w for w in caught if issubclass(w.category, GpufeedWarning)]
    assert len(said) == 2, [str(w.message) for w in said]
    for warning in said:
        text = str(warning.message)
        assert "takes the generic path" in text and reason in text and fix in text, text
        assert "gpufeed.explain(loader)" in text
    assert said[0].filename == __file__  # the line that made the loader
    stats = loader.stats()
    assert stats["path"] == "generic" and reason in stats["path_reason"] and fix in stats["path_reason"]
    text = gpufeed.explain(loader)
    assert text.startswith("FastLoader: the generic path") and reason in text and fix in text, text


def test_the_image_path_warns_nothing_and_says_so(root):
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpufeedWarning)
        loader = FastLoader(ImageFolder(root, transform=ResizeCenterCrop(16)), batch_size=2)
        images, _ = next(iter(loader))
    assert images.shape == (2, 3, 16, 16)
    stats = loader.stats()
    assert stats["path"] == "image" and stats["path_reason"] is None
    lines = gpufeed.explain(loader).splitlines()
    assert lines[0].startswith("FastLoader: the image fast path"), lines
    assert lines[1].startswith("ImageFolder's transform: gpufeed transform ResizeCenterCrop: fast path")


def test_a_loader_of_any_other_dataset_is_generic_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpufeedWarning)
        loader = FastLoader(TensorDataset(torch.arange(8)), batch_size=2, collate_fn=default_collate)
        assert len(list(loader)) == 4
    stats = loader.stats()
    assert stats["path"] == "generic" and "TensorDataset, not a gpufeed image dataset" in stats["path_reason"]
    assert gpufeed.explain(loader) == ("FastLoader: the generic path (per-sample __getitem__ + collate "
                                       "in the workers, slower), because the dataset is a TensorDataset, "
                                       "not a gpufeed image dataset.")


def test_explain_of_a_torch_dataloader_says_what_fastloader_would_do(root):
    fast = DataLoader(ImageFolder(root, transform=ResizeCenterCrop(16)), batch_size=2)
    text = gpufeed.explain(fast)
    assert text.startswith("DataLoader: torch's own per-sample path") and \
        "FastLoader with the same arguments would take the image fast path." in text
    slow = DataLoader(ImageFolder(root, transform=to_tensor), batch_size=2)
    assert "would take the generic path (per-sample" in gpufeed.explain(slow)


def test_explain_of_a_dataset_or_a_transform(root):
    ds = ImageFolder(root, transform=ResizeCenterCrop(16))
    assert gpufeed.explain(ds) == "ImageFolder's transform: " + gpufeed.image.explain_transform(ds.transform)
    assert gpufeed.explain(ds.transform) == gpufeed.image.explain_transform(ds.transform)
    assert gpufeed.explain(None).startswith("no transform")


def test_the_path_follows_the_dataset_when_it_changes_before_iteration(root):
    ds = ImageFolder(root, transform=ResizeCenterCrop(16))
    loader = FastLoader(ds, batch_size=2)
    assert loader.stats()["path"] == "image"
    ds.transform = to_tensor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpufeedWarning)
        images, _ = next(iter(loader))  # the feed is made at the first iter(), as the path
    assert tuple(images.shape) == (2, 3, 4, 4)
    assert loader.stats()["path"] == "generic" and "user callable" in loader.stats()["path_reason"]


def test_a_target_transform_keeps_the_image_path(root):
    ds = ImageFolder(root, transform=ResizeCenterCrop(16), target_transform=str)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpufeedWarning)
        loader = FastLoader(ds, batch_size=2)
        _, labels = next(iter(loader))
    assert list(labels) == [str(ds.targets[0]), str(ds.targets[1])]
    assert loader.stats()["path"] == "image" and loader.stats()["path_reason"] is None
