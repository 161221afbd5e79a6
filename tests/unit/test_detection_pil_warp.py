"""An op before the conversion to tensor warps torchvision's PIL image with PIL: gpufeed's
``pil_warp_image`` gives PIL's own nearest pixels for ``Image.rotate`` (any angle, centre,
``expand``) and ``Image.transform(AFFINE)`` (torchvision's inverse affine matrices: scales,
one-axis shears, quarter turns, general ones), every pixel, fill included."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gpufeed.image.augment import _warp
from gpufeed.image.detection._affine_warp import pil_warp_image

FILL = (1, 2, 3)


def _rotation(rng: np.random.Generator, img: np.ndarray):
    h, w = img.shape[:2]
    angle = float(rng.choice([90.0, 180.0, 270.0, -90.0, 45.0, float(rng.uniform(-180, 180))]))
    center = None if rng.random() < 0.5 else (float(rng.integers(0, w)) + float(rng.choice([0.0, 0.5])),
                                              float(rng.integers(0, h)) + float(rng.choice([0.0, 0.5])))
    expand = bool(rng.random() < 0.5)
    turn = angle % 360
    if center is None and (turn in (0, 180) or (turn in (90, 270) and (expand or h == w))):
        return None  # PIL transposes: gpufeed's quarter turns (np.rot90) take these
    want = np.asarray(Image.fromarray(img).rotate(angle, Image.NEAREST, expand=expand, center=center, fillcolor=FILL))
    matrix, size = _warp.rotate_matrix(angle, h, w, center), (h, w)
    if expand:
        matrix, size = _warp.rotate_expanded(matrix, h, w)
    return want, matrix, size


def _affine(rng: np.random.Generator, img: np.ndarray):
    h, w = img.shape[:2]
    scale = float(rng.choice([0.5, 1.0, 2.0, float(rng.uniform(0.6, 1.5))]))
    angle = float(rng.choice([0.0, 90.0, float(rng.uniform(-40, 40))]))
    shear = (float(rng.choice([0.0, float(rng.uniform(-20, 20))])), 0.0)
    shift = (int(rng.integers(-9, 9)), int(rng.integers(-9, 9)))
    matrix = _warp.affine_matrix((w * 0.5, h * 0.5), angle, shift, scale, shear)
    want = np.asarray(Image.fromarray(img).transform((w, h), Image.AFFINE, matrix, Image.NEAREST, fillcolor=FILL))
    return want, matrix, (h, w)


@pytest.mark.parametrize("make", [_rotation, _affine])
def test_nearest_warps_are_pils_pixels(make):
    rng = np.random.default_rng(0)
    for case in range(150):
        h, w = (int(v) for v in rng.integers(5, 120, 2))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        made = make(rng, img)
        if made is None:
            continue
        want, matrix, size = made
        got = pil_warp_image(img, list(matrix), size, "nearest", FILL)
        assert got.shape == want.shape and np.array_equal(got, want), f"case {case}: {matrix}, {size}"
