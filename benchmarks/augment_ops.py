"""Per-op cost of gpufeed's augmentations on a 224 x 224 uint8 row against the same op of
torchvision/PIL on a PIL image (one thread, alternating, median of rounds; ratios in one run).

    python -m benchmarks.augment_ops [--rounds 7] [--reps 200]

Needs torchvision and timm (the .venv-tv environment). The policies' rows include their draws
(gpufeed: ``row_rng`` + ``draw``; torchvision/timm: their forward on PIL).

Private imports: ``gpufeed.image.augment`` (``_warp``, ``functional``), the row ops it measures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def _cases():
    import torchvision.transforms.functional as F
    from PIL import Image, ImageOps

    from gpufeed.image.augment import _functional as G
    from gpufeed.image.augment import _warp

    fill = (0, 0, 0)
    return [
        ("brightness 1.3", lambda r: G.brightness(r, 1.3), lambda p: F.adjust_brightness(p, 1.3)),
        ("contrast 0.7", lambda r: G.contrast(r, 0.7), lambda p: F.adjust_contrast(p, 0.7)),
        ("saturation 1.4", lambda r: G.color(r, 1.4), lambda p: F.adjust_saturation(p, 1.4)),
        ("hue 0.1", lambda r: G.hue(r, 0.1), lambda p: F.adjust_hue(p, 0.1)),
        ("grayscale", G.grayscale, lambda p: F.rgb_to_grayscale(p, 3)),
        ("gaussian_blur k23 s1.5", lambda r: G.blur(r, (23, 23), (1.5, 1.5)),
         lambda p: F.gaussian_blur(p, [23, 23], [1.5, 1.5])),
        ("solarize 128", lambda r: G.solarize(r, 128), lambda p: F.solarize(p, 128)),
        ("posterize 4", lambda r: G.posterize(r, 4), lambda p: F.posterize(p, 4)),
        ("equalize", G.equalize, F.equalize),
        ("autocontrast", G.autocontrast, F.autocontrast),
        ("invert", G.invert, F.invert),
        ("sharpness 1.5", lambda r: G.sharpness(r, 1.5), lambda p: F.adjust_sharpness(p, 1.5)),
        ("rotate 20 nearest", lambda r: _warp.warp(r, _warp.rotate_matrix(20, 224, 224), fill),
         lambda p: F.rotate(p, 20)),
        ("shear_x 0.3 nearest",
         lambda r: _warp.warp(r, _warp.affine_matrix((0, 0), 0, (0, 0), 1, (16.7, 0)), fill),
         lambda p: F.affine(p, 0, [0, 0], 1, [16.7, 0], center=[0, 0])),
        ("translate_x 30", lambda r: _warp.warp(r, (1, 0, 30, 0, 1, 0), fill),
         lambda p: p.transform(p.size, Image.AFFINE, (1, 0, 30, 0, 1, 0))),
        ("pil round trip (ImageOps.invert)", G.invert, ImageOps.invert),
    ] + _recipes()


def _recipes():
    """Whole ops as the recipes use them, parameters drawn (the draw included in the time)."""
    import itertools

    import torchvision.transforms as T
    from timm.data.auto_augment import auto_augment_transform, desaturate, gaussian_blur, rand_augment_transform

    from gpufeed.image import augment as A
    from gpufeed.image.augment import _functional as G

    counter = itertools.count()

    def ours(op):
        return lambda r: op(r, A.row_rng(0, 0, next(counter)))

    return [
        ("ColorJitter(0.4, 0.4, 0.4)", ours(A.ColorJitter(0.4, 0.4, 0.4)),
         T.ColorJitter(0.4, 0.4, 0.4)),
        ("TrivialAugmentWide", ours(A.TrivialAugmentWide()), T.TrivialAugmentWide()),
        ("RandAugment(2, 9)", ours(A.RandAugment(2, 9)), T.RandAugment(2, 9)),
        ("AutoAugment(imagenet)", ours(A.AutoAugment()), T.AutoAugment()),
        ("timm rand-m9-mstd0.5-inc1", ours(A.TimmRandAugment.from_config("rand-m9-mstd0.5-inc1")),
         _posterize_zero_passes(rand_augment_transform("rand-m9-mstd0.5-inc1", {}))),
        ("timm original-mstd0.5", ours(A.TimmAutoAugment.from_config("original-mstd0.5")),
         auto_augment_transform("original-mstd0.5", {})),
        ("RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 10)",
         ours(A.RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 10)),
         T.RandomAffine(15, (0.1, 0.1), (0.9, 1.1), 10)),
        ("RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], 0.8)",
         ours(A.RandomApply((A.ColorJitter(0.4, 0.4, 0.4, 0.1),), 0.8)),
         T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], 0.8)),
        ("timm gaussian_blur 1.5 (PIL's)", lambda r: G.pil_gaussian_blur(r, 1.5),
         lambda p: gaussian_blur(p, 1.5)),
        ("timm desaturate 1.0 (grey)", lambda r: G.grayscale(r), lambda p: desaturate(p, 1.0)),
        ("timm 3a", ours(A.TimmAutoAugment.from_config("3a")), auto_augment_transform("3a", {})),
    ]


def _posterize_zero_passes(op: Callable[[object], object]) -> Callable[[object], object]:
    """timm's PosterizeIncreasing reaches 0 bits at magnitude 10 (mstd noise gets there), which
    Pillow >= 13 refuses with ValueError; such a draw counts as a no-op call here instead of
    ending the run (gpufeed gives zeros there, as torchvision's tensor op does)."""

    def call(img: object) -> object:
        try:
            return op(img)
        except ValueError:
            return img

    return call


def _time(fn: Callable[[], object], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    import cv2
    import torch
    from PIL import Image

    from gpufeed.synth import photo_like

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    img = photo_like(224, 224, seed=3)
    pil = Image.fromarray(img)
    print(f"{'op':34s} {'gpufeed us':>10s} {'PIL us':>10s} {'PIL/gpufeed':>12s}")
    for name, ours, theirs in [c for c in _cases() if not c[0].startswith("pil round")]:
        a, b = [], []
        for _ in range(args.rounds):  # alternating
            a.append(_time(lambda f=ours: f(img.copy()), args.reps))
            b.append(_time(lambda f=theirs: f(pil), args.reps))
        ma, mb = statistics.median(a) * 1e6, statistics.median(b) * 1e6
        print(f"{name:34s} {ma:10.1f} {mb:10.1f} {mb / ma:11.1f}x")
    copy = statistics.median(_time(lambda: img.copy(), args.reps) for _ in range(args.rounds))
    print(f"(gpufeed figures include a {copy * 1e6:.1f} us row copy)")


if __name__ == "__main__":
    main()
