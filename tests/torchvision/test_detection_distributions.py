"""The random geometric joint ops draw their parameters from torchvision v2's distributions:
2,000 draws of ours (``draw``, numpy generator) against 2,000 of the torchvision op's
``make_params`` under ``torch.manual_seed``, compared feature by feature by two-sample
Kolmogorov-Smirnov tests (continuous or many-valued) and chi-square (categories), and the
probability of the random-apply ops against ``p``, at 0.001 from fixed seeds (the same result
on every run). Needs torchvision (.venv-tv)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from gpufeed.image.detection import _crops, _geometry  # noqa: E402
from gpufeed.image.detection._sample import Boxes, Sample  # noqa: E402
from tests.torchvision._stats import (  # noqa: E402
    assert_probability,
    assert_same_categories,
    assert_same_continuous,
)

pytestmark = pytest.mark.timeout(300)
N = 2000
SEED = 11
BOXES = np.array([[10, 20, 60, 90], [100, 40, 180, 200], [200, 150, 310, 230], [30, 160, 80, 235]],
                 dtype=np.float64)


def ours(name: str, *args: Any, **kwargs: Any) -> Any:
    module = _crops if hasattr(_crops, name) else _geometry
    return getattr(module, name)(*args, **kwargs)


def draws(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], h: int, w: int,
          ) -> tuple[list[Any], list[Any]]:
    """(our N parameter draws, torchvision's N) for the op on an h x w sample with BOXES."""
    mine, theirs = ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)
    sample = Sample(np.zeros((h, w, 3), np.uint8), {"boxes": Boxes(BOXES, "XYXY", (h, w))})
    rng = np.random.default_rng(SEED)
    a = [mine.draw(rng, sample) for _ in range(N)]
    flat = [tv_tensors.Image(torch.zeros(3, h, w, dtype=torch.uint8)),
            tv_tensors.BoundingBoxes(torch.from_numpy(BOXES).float(), format="XYXY", canvas_size=(h, w))]
    torch.manual_seed(SEED)
    b = [theirs.make_params(flat) for _ in range(N)]
    return a, b


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]], features: dict[str, Callable[[Any], Any]],
            what: str, categorical: bool = False) -> None:
    for feature, fn in features.items():
        fa, fb = [fn(p) for p in a], [fn(p) for p in b]
        if categorical:
            assert_same_categories(fa, fb, f"{what} {feature}")
        else:
            assert_same_continuous(fa, fb, f"{what} {feature}")


@pytest.mark.parametrize("hw", [(240, 320), (400, 150)])
@pytest.mark.parametrize("kwargs", [{}, {"scale": (0.5, 1.0), "ratio": (0.5, 2.0)}, {"ratio": (2.5, 3.0)}])
def test_random_resized_crop(hw, kwargs):
    h, w = hw
    a, b = draws("RandomResizedCrop", (96,), kwargs, h, w)
    compare(a, b, {"area share": lambda p: p["height"] * p["width"] / (h * w),
                   "log aspect": lambda p: np.log(p["width"] / p["height"]),
                   "centre row": lambda p: (p["top"] + p["height"] / 2) / h,
                   "centre column": lambda p: (p["left"] + p["width"] / 2) / w}, "RandomResizedCrop")
    centred = {"centred": lambda p: (p["top"] == (h - p["height"]) // 2, p["left"] == (w - p["width"]) // 2)}
    compare(a, b, centred, "RandomResizedCrop", categorical=True)


@pytest.mark.parametrize("name", ["RandomHorizontalFlip", "RandomVerticalFlip"])
@pytest.mark.parametrize("p", [0.5, 0.2])
def test_flips(name, p):
    op = ours(name, p=p)
    sample = Sample(np.zeros((4, 5, 3), np.uint8), {})
    rng = np.random.default_rng(SEED)
    assert_probability([op.draw(rng, sample) is not None for _ in range(N)], p, name)


def test_zoom_out():
    a, b = draws("RandomZoomOut", (), {"p": 1.0, "side_range": (1.0, 3.0)}, 240, 320)
    sides = ["left", "top", "right", "bottom"]
    compare(a, b, {side: (lambda p, i=i: p["padding"][i]) for i, side in enumerate(sides)}, "RandomZoomOut")
    op = ours("RandomZoomOut", p=0.3)
    sample = Sample(np.zeros((24, 32, 3), np.uint8), {})
    rng = np.random.default_rng(SEED)
    assert_probability([op.draw(rng, sample) is not None for _ in range(N)], 0.3, "RandomZoomOut")


@pytest.mark.parametrize("kwargs", [{}, {"min_scale": 0.5, "sampler_options": [0.3, 0.7, 2.0], "trials": 10}])
def test_iou_crop(kwargs):
    a, b = draws("RandomIoUCrop", (), kwargs, 240, 320)
    a = [p if p is not None else {} for p in a]
    compare(a, b, {"no crop": lambda p: not p}, "RandomIoUCrop", categorical=True)
    a, b = [p for p in a if p], [p for p in b if p]
    compare(a, b, {"height": lambda p: p["height"], "width": lambda p: p["width"],
                   "top": lambda p: p["top"], "left": lambda p: p["left"]}, "RandomIoUCrop")
    inside = {"boxes inside": lambda p: tuple(
        bool(v) for v in np.asarray(p.get("inside", p.get("is_within_crop_area"))))}
    compare(a, b, inside, "RandomIoUCrop", categorical=True)


@pytest.mark.parametrize("hw", [(240, 320), (500, 200)])
def test_scale_jitter(hw):
    a, b = draws("ScaleJitter", ((300, 250),), {"scale_range": (0.3, 1.5)}, *hw)
    compare(a, b, {"height": lambda p: p["size"][0], "width": lambda p: p["size"][1]}, "ScaleJitter")


def test_random_shortest_size():
    a, b = draws("RandomShortestSize", ([480, 512, 544, 576, 608, 640],), {"max_size": 700}, 240, 320)
    compare(a, b, {"size": lambda p: tuple(p["size"])}, "RandomShortestSize", categorical=True)


def test_random_resize():
    a, b = draws("RandomResize", (100, 180), {}, 240, 320)
    compare(a, b, {"size": lambda p: p["size"][0]}, "RandomResize", categorical=True)


@pytest.mark.parametrize("kwargs", [{}, {"padding": [4, 9], "pad_if_needed": True}])
def test_random_crop(kwargs):
    a, b = draws("RandomCrop", ((200, 300),), kwargs, 240, 320)
    compare(a, b, {"top": lambda p: p["top"], "left": lambda p: p["left"]}, "RandomCrop")
