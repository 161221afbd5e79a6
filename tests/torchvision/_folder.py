"""The image folder of the torchvision tests: demo JPEGs (gpufeed.synth) of several sizes and
aspect ratios, and one with an EXIF orientation tag (rotate 90 degrees) that torchvision ignores."""

from __future__ import annotations

from pathlib import Path

import torch

from gpufeed.synth import encode, photo_like, with_exif_orientation

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# (height, width) in pixels: landscape, portrait, square, small, large, extreme ratios
SIZES = ((350, 400), (500, 375), (240, 320), (900, 600), (230, 600), (224, 224),
         (300, 230), (640, 480), (256, 700), (700, 260), (260, 260))
EXIF_INDEX = len(SIZES)  # the last file, class_1/img_05.jpg in sorted order


def make_folder(root: Path) -> Path:
    """Write root/class_0 and root/class_1 (torchvision ImageFolder layout); returns root."""
    for k, (h, w) in enumerate(SIZES):
        folder = root / f"class_{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{k // 2:02d}.jpg").write_bytes(encode(photo_like(h, w, seed=k)))
    rotated = with_exif_orientation(encode(photo_like(280, 420, seed=99)), 6)
    (root / "class_1" / "img_99.jpg").write_bytes(rotated)
    return root


def grey_levels(x: torch.Tensor, normalized: bool = True) -> torch.Tensor:
    """A CHW image on the 0-255 scale: ``normalized`` undoes Normalize(MEAN, STD) and ToTensor's
    /255; otherwise ``x`` holds 0-255 values (uint8) already."""
    x = torch.as_tensor(x).as_subclass(torch.Tensor).float()
    if not normalized:
        return x
    return (x * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)) * 255.0


def mean_abs_levels(a: torch.Tensor, b: torch.Tensor, normalized: bool = True) -> float:
    """Mean absolute difference of two images, in grey levels (0-255 scale)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((grey_levels(a, normalized) - grey_levels(b, normalized)).abs().mean())
