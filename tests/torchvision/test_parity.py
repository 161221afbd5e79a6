"""Translated torchvision pipelines reproduce torchvision's own output (real torchvision).

Eval (Resize + CenterCrop) is compared with torchvision's ``ImageFolder`` + the same pipeline;
train (RandomResizedCrop + flip) with torchvision's functional ops given gpufeed's crop box and
flip for each (seed, epoch, index). Limit: a mean absolute difference of 3 grey levels (0-255).
These tests need torchvision: ``make test`` runs them in ``.venv-tv``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.functional as F1  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
import torchvision.transforms.v2.functional as F2  # noqa: E402

from gpufeed import (  # noqa: E402
    FastLoader,
    ImageDataset,
    ImageFolder,
    LMDBDataset,
    ResizeCenterCrop,
    TorchvisionPipeline,
    pack,
    read_header,
)
from gpufeed.synth import photo_like  # noqa: E402
from tests.torchvision._folder import (  # noqa: E402
    EXIF_INDEX,
    MEAN,
    STD,
    grey_levels,
    make_folder,
    mean_abs_levels,
)  # noqa: E402

pytestmark = pytest.mark.timeout(120)
LIMIT = 3.0  # grey levels, mean absolute difference


def eval_v1():
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def eval_v1_on_tensors():
    # geometry after ToTensor: torchvision resizes the float tensor (antialiased)
    return T.Compose([T.ToTensor(), T.Resize(256), T.CenterCrop(224), T.Normalize(MEAN, STD)])


def eval_v2():
    return V.Compose([V.ToImage(), V.Resize(256), V.CenterCrop(224),
                      V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD)])


def train_v1(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    return T.Compose([T.RandomResizedCrop(224, scale=scale, ratio=ratio),
                      T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def train_v2():
    # torchvision's documented v2 recipe: to a tensor first, geometry on the uint8 tensor
    return V.Compose([V.ToImage(), V.RandomResizedCrop(size=(224, 224), antialias=True),
                      V.RandomHorizontalFlip(p=0.5), V.ToDtype(torch.float32, scale=True),
                      V.Normalize(mean=MEAN, std=STD)])


def train_reference_v1(pil, p):
    out = F1.resized_crop(pil, p.top, p.left, p.height, p.width, [224, 224])
    out = F1.hflip(out) if p.flip else out
    return F1.normalize(F1.to_tensor(out), MEAN, STD)


def train_reference_v2(pil, p):
    out = F2.resized_crop(F2.to_image(pil), p.top, p.left, p.height, p.width, [224, 224],
                          antialias=True)
    out = F2.horizontal_flip(out) if p.flip else out
    return F2.normalize(F2.to_dtype(out, torch.float32, scale=True), MEAN, STD)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("tvfolder"))


@pytest.fixture(scope="module")
def tv_plain(root):
    """torchvision's ImageFolder without a transform: PIL images, EXIF ignored."""
    return tv.datasets.ImageFolder(str(root))


@pytest.mark.parametrize("make", [eval_v1, eval_v1_on_tensors, eval_v2],
                         ids=["v1", "v1-tensor", "v2"])
def test_eval_matches_torchvision(root, make):
    ours = ImageFolder(root, transform=make())
    theirs = tv.datasets.ImageFolder(str(root), transform=make())
    assert isinstance(ours.transform, TorchvisionPipeline)
    assert ours.samples == theirs.samples
    expected = []
    for i in range(len(ours)):
        (x, y), (ref, ref_y) = ours[i], theirs[i]
        assert (type(x), x.dtype, x.shape, y) == (type(ref), ref.dtype, ref.shape, ref_y)
        assert mean_abs_levels(x, ref) <= LIMIT, (i, ours.path(i))
        expected.append(x)
    # FastLoader batches the same values on its fast path (dtype/normalize per batch)
    loader = FastLoader(ours, batch_size=4, num_workers=2)
    assert loader._image_path
    got = torch.cat([images for images, _ in loader])
    assert got.dtype == torch.float32 and got.shape == (len(ours), 3, 224, 224)
    torch.testing.assert_close(got, torch.stack([e.as_subclass(torch.Tensor) for e in expected]),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("make,reference", [(train_v1, train_reference_v1),
                                            (train_v2, train_reference_v2)], ids=["v1", "v2"])
def test_train_matches_torchvision_functional_with_the_same_box(root, tv_plain, make, reference):
    ours = ImageFolder(root, transform=make())
    pipe = ours.transform
    assert isinstance(pipe, TorchvisionPipeline)
    flips = set()
    seed = 5
    loader = FastLoader(ours, batch_size=4, num_workers=2, seed=seed)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got = torch.cat([images for images, _ in loader])
        for i in range(len(ours)):
            pil = tv_plain[i][0]
            p = pipe.params(seed, epoch, i, pil.height, pil.width)
            flips.add(p.flip)
            assert mean_abs_levels(got[i], reference(pil, p)) <= LIMIT, (epoch, i, p)
    assert flips == {True, False}  # both branches of the flip were compared
    # dataset[i]: the dataset's own epoch and seed 0
    ours.set_epoch(3)
    for i in (0, 4, EXIF_INDEX):
        pil = tv_plain[i][0]
        x, _ = ours[i]
        assert mean_abs_levels(x, reference(pil, pipe.params(0, 3, i, pil.height, pil.width))) <= LIMIT


def test_train_scale_ratio_are_translated(root, tv_plain):
    pipe = ImageFolder(root, transform=train_v1(scale=(0.5, 0.6), ratio=(1.0, 1.2))).transform
    assert isinstance(pipe, TorchvisionPipeline)
    assert (pipe.geometry.scale, pipe.geometry.ratio) == ((0.5, 0.6), (1.0, 1.2))
    pil = tv_plain[0][0]
    for index in range(20):
        p = pipe.params(0, 0, index, pil.height, pil.width)
        area = p.height * p.width / (pil.height * pil.width)
        assert 0.48 <= area <= 0.62 and 0.97 <= p.width / p.height <= 1.23, p


def test_v2_to_image_output_type_as_torchvision(root):
    ours = ImageFolder(root, transform=train_v2())
    theirs = tv.datasets.ImageFolder(str(root), transform=train_v2())
    assert type(ours[0][0]) is type(theirs[0][0]) is tv.tv_tensors.Image
    uint8 = V.Compose([V.PILToTensor(), V.Resize(256), V.CenterCrop(224)])
    x, ref = ImageFolder(root, transform=uint8)[1][0], tv.datasets.ImageFolder(str(root), transform=uint8)[1][0]
    assert (type(x), x.dtype) == (type(ref), ref.dtype) == (torch.Tensor, torch.uint8)
    assert mean_abs_levels(x.float(), ref.float(), normalized=False) <= LIMIT


def test_exif_orientation_ignored_as_torchvision_does(root):
    ours = ImageFolder(root, transform=eval_v1())
    theirs = tv.datasets.ImageFolder(str(root), transform=eval_v1())
    with open(ours.path(EXIF_INDEX), "rb") as f:
        assert read_header(f.read()).orientation == 6
    x, ref = ours[EXIF_INDEX][0], theirs[EXIF_INDEX][0]
    assert mean_abs_levels(x, ref) <= LIMIT
    # gpufeed's own transform applies the orientation: a different picture
    own = ImageFolder(root, transform=ResizeCenterCrop(224, 256))[EXIF_INDEX][0]
    assert mean_abs_levels(own, grey_levels(ref), normalized=False) > 10


def test_image_dataset_and_lmdb_translate_too(root, tmp_path):
    theirs = tv.datasets.ImageFolder(str(root), transform=eval_v2())
    wrapped = ImageDataset(tv.datasets.ImageFolder(str(root)), transform=eval_v2())
    pack(root, tmp_path / "db.lmdb", progress=False)
    packed = LMDBDataset(tmp_path / "db.lmdb", transform=eval_v1())
    for ds in (wrapped, packed):
        assert isinstance(ds.transform, TorchvisionPipeline), type(ds)
        for i in (0, 5, EXIF_INDEX):
            assert mean_abs_levels(ds[i][0], theirs[i][0]) <= LIMIT, (type(ds).__name__, i)


def test_loader_dtype_overrides_the_pipeline_float32(root):
    ours = ImageFolder(root, transform=eval_v1())
    images, _ = next(iter(FastLoader(ours, batch_size=3, num_workers=0, dtype=torch.float16)))
    assert images.dtype == torch.float16
    torch.testing.assert_close(images[0].float(), ours[0][0], rtol=0, atol=2e-2)


def test_plain_dataloader_gets_what_torchvision_gives(root):
    ours = ImageFolder(root, transform=eval_v1())
    theirs = tv.datasets.ImageFolder(str(root), transform=eval_v1())
    a = next(iter(torch.utils.data.DataLoader(ours, batch_size=4, num_workers=0)))
    b = next(iter(torch.utils.data.DataLoader(theirs, batch_size=4, num_workers=0)))
    assert a[0].shape == b[0].shape and a[0].dtype == b[0].dtype and torch.equal(a[1], b[1])
    for x, ref in zip(a[0], b[0]):
        assert mean_abs_levels(x, ref) <= LIMIT


def test_deep_greyscale_images_take_the_values_torchvision_gives(tmp_path):
    """16-bit greyscale PNGs and TIFFs (depth maps, scans): torchvision's loader clips their
    values to 0-255 (PIL's convert("RGB")); FastLoader's image path gives the same picture,
    not a rescaled one."""
    import cv2
    import numpy as np

    for k, (ext, scale) in enumerate(((".png", 2), (".tiff", 2), (".png", 257))):
        folder = tmp_path / f"class_{k % 2}"
        folder.mkdir(exist_ok=True)
        deep = photo_like(260 + 10 * k, 300, seed=k)[..., 0].astype(np.uint16) * scale
        cv2.imwrite(str(folder / f"deep_{k}{ext}"), deep)
    ours = ImageFolder(tmp_path, transform=eval_v2())
    theirs = tv.datasets.ImageFolder(str(tmp_path), transform=eval_v2())
    assert ours.samples == theirs.samples and len(ours) == 3
    loader = FastLoader(ours, batch_size=3, num_workers=2)
    assert loader._image_path
    (images, _), = list(loader)
    for i in range(len(ours)):
        assert mean_abs_levels(images[i], theirs[i][0]) <= LIMIT, ours.path(i)
        assert mean_abs_levels(ours[i][0], theirs[i][0]) <= LIMIT, ours.path(i)
