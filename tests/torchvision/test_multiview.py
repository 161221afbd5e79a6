"""MultiView of torchvision v2 pipelines: DINO's multi-crop translates fully, each view against
torchvision's own ops on the PIL image given the same crop, the batch's structure.

Real torchvision (``make test`` runs this folder in ``.venv-tv``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

import torchvision.transforms.v2 as V  # noqa: E402
import torchvision.transforms.v2.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed import FastLoader, ImageFolder, MultiView  # noqa: E402
from tests.torchvision._folder import EXIF_INDEX, MEAN, STD, make_folder  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("multiview") / "images")


def dino_view(size: int, scale: tuple[float, float], blur_p: float) -> V.Compose:
    """One of DINO's views (its DataAugmentationDINO, in torchvision v2)."""
    return V.Compose([
        V.RandomResizedCrop(size, scale=scale, interpolation=V.InterpolationMode.BICUBIC),
        V.RandomHorizontalFlip(p=0.5),
        V.RandomApply([V.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)], p=0.8),
        V.RandomGrayscale(p=0.2),
        V.RandomApply([V.GaussianBlur(kernel_size=9, sigma=(0.1, 2.0))], p=blur_p),
        V.ToImage(), V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD),
    ])


def dino() -> MultiView:
    return MultiView([dino_view(224, (0.4, 1.0), 1.0), dino_view(224, (0.4, 1.0), 0.1)]
                     + [dino_view(96, (0.05, 0.4), 0.5)] * 6)


def test_dino_multi_crop_translates_fully_and_explain_says_so(root):
    views = dino()
    assert views.translated, views.blockers
    text = gpufeed.explain(views)
    assert "fast path; one decode per sample" in text
    assert "view 0 (224x224)" in text and "view 1 (224x224)" in text and "views 2-7 (96x96)" in text
    assert " NO " not in text and "generic" not in text
    loader = FastLoader(ImageFolder(root, transform=views), batch_size=4, num_workers=0)
    assert loader.stats()["path"] == "image", loader.stats()["path_reason"]


def test_dino_batches_are_a_list_of_eight_normalized_view_batches(root):
    ds = ImageFolder(root, transform=dino())
    images, target = ds[0]
    assert [tuple(t.shape) for t in images] == [(3, 224, 224)] * 2 + [(3, 96, 96)] * 6
    assert all(t.dtype == torch.float32 for t in images) and isinstance(target, int)
    loader = FastLoader(ds, batch_size=4, num_workers=2, seed=0)
    (views, labels), *_ = list(loader)
    assert isinstance(views, list) and [tuple(v.shape) for v in views] == [(4, 3, 224, 224)] * 2 + [(4, 3, 96, 96)] * 6
    assert labels.dtype == torch.int64
    # dataset[i] (epoch 0, seed 0) is what the loader batches, view for view
    for v, batch in enumerate(views):
        assert torch.equal(batch[0], images[v])


def test_each_view_matches_torchvision_on_the_pil_image_with_the_same_crop(root):
    """Geometry only (bilinear, antialiased): each view's pixels against torchvision's
    resized_crop + hflip of the PIL image at the crop gpufeed drew for that view; mean absolute
    difference within the DCT-scaled tolerance (2.5 levels)."""
    pipelines = [V.Compose([V.RandomResizedCrop(size, scale=scale), V.RandomHorizontalFlip(), V.PILToTensor()])
                 for size, scale in [(224, (0.4, 1.0))] * 2 + [(96, (0.05, 0.4))] * 3]
    views = MultiView(pipelines)
    ds = ImageFolder(root, transform=views)
    diffs = []
    for index, (path, _) in enumerate(ds.samples):
        if index == EXIF_INDEX:
            continue
        data = Path(path).read_bytes()
        got = views.outputs(data, index=index)
        pil = Image.open(path).convert("RGB")
        for v, view in enumerate(views.views):
            p = view.params(0, 0, index, pil.height, pil.width)
            want = F.resized_crop(F.pil_to_tensor(pil), p.top, p.left, p.height, p.width,
                                  list(view.output_size), antialias=True)
            if p.flip:
                want = F.horizontal_flip(want)
            diffs.append(float((got[v].float() - want.float()).abs().mean()))
    assert np.mean(diffs) <= 2.5 and max(diffs) <= 4.0, (np.mean(diffs), max(diffs))


def test_views_with_different_normalize_are_refused():
    a = V.Compose([V.RandomResizedCrop(32), V.ToImage(), V.ToDtype(torch.float32, scale=True),
                   V.Normalize(MEAN, STD)])
    b = V.Compose([V.RandomResizedCrop(32), V.ToImage(), V.ToDtype(torch.float32, scale=True)])
    with pytest.raises(ValueError, match="Normalize and dtype: view 0 has"):
        MultiView([a, b])
