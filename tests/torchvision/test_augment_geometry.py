"""The geometry the recipes add: bicubic RandomResizedCrop, timm's random bilinear/bicubic
(``RandomResizedCropAndInterpolation``) and ``Resize((h, w))``, against torchvision on PIL
images given the same box (mean absolute difference <= 3 grey levels), and timm's choice of
interpolation drawn with the same probabilities. Needs torchvision and timm (.venv-tv)."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
timm_tf = pytest.importorskip("timm.data.transforms", reason="timm is not installed (tvtest extra)")

import torchvision.transforms.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402

from gpufeed.image import RandomResizedCrop, Resize  # noqa: E402
from gpufeed.synth import encode, photo_like  # noqa: E402
from tests.torchvision._augment import GEOMETRY, mean_abs  # noqa: E402
from tests.torchvision._stats import assert_same_categories  # noqa: E402

pytestmark = pytest.mark.timeout(120)
SIZES = ((350, 400), (500, 375), (900, 600), (230, 600), (224, 224))
_MODES = {"auto": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def _images():
    for k, (h, w) in enumerate(SIZES):
        data = encode(photo_like(h, w, seed=k))
        yield data, Image.open(io.BytesIO(data)).convert("RGB")


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_random_resized_crop_interpolation(interpolation):
    t = RandomResizedCrop(224, interpolation=interpolation)
    for data, pil in _images():
        for index in range(3):
            p = t.params(0, 0, index, pil.height, pil.width)
            mode = _MODES[t.sample_interpolation(0, 0, index)]
            out = np.empty((224, 224, 3), np.uint8)
            t.apply(data, index=index, out=out)
            want = F.resized_crop(pil, p.top, p.left, p.height, p.width, [224, 224],
                                  interpolation=mode)
            want = F.hflip(want) if p.flip else want
            assert mean_abs(out, np.asarray(want)) <= GEOMETRY, (pil.size, index, mode)


@pytest.mark.parametrize("interpolation", ["auto", "bicubic"])
def test_resize_to_a_pair(interpolation):
    t = Resize((200, 260), interpolation=interpolation)
    for data, pil in _images():
        out = np.empty((200, 260, 3), np.uint8)
        t.apply(data, out=out)
        want = F.resize(pil, [200, 260], interpolation=_MODES[interpolation])
        assert mean_abs(out, np.asarray(want)) <= GEOMETRY, pil.size


def test_timm_random_interpolation_choice():
    rrc = timm_tf.RandomResizedCropAndInterpolation(224, interpolation="random")
    assert len(rrc.interpolation) == 2  # bilinear and bicubic, chosen per image
    random.seed(0)
    theirs = [random.choice(rrc.interpolation).value for _ in range(2000)]
    t = RandomResizedCrop(224, interpolation="random")
    ours = [{"auto": "bilinear", "bicubic": "bicubic"}[t.sample_interpolation(3, 0, i)]
            for i in range(2000)]
    assert_same_categories(ours, theirs, "interpolation")
