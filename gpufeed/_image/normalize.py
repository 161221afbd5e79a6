"""The values of an image batch: its dtype and ``normalize``, checked in one place and computed
as one per-channel multiply-add.

``(x / 255 - mean) / std`` is applied as ``x * scale + shift`` with ``scale = 1 / (255 * std)``
and ``shift = -mean / std`` (one pass over the batch instead of three). Without ``normalize`` a
float batch is ``x / 255``. The CPU fill (``gpufeed._image.fill``) and the GPU transform
(``gpufeed.cuda.GpuTransform``) both convert through :func:`to_float_`, so the two paths give
the same numbers.
"""

from __future__ import annotations

import warnings

import torch

from gpufeed.errors import GpufeedWarning, shorten

__all__ = ["FLOAT_DTYPES", "Normalize", "affine", "check_image_output", "scale_shift", "to_float_"]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# ((mean_r, mean_g, mean_b), (std_r, std_g, std_b)) in torchvision's 0-1 scale
Normalize = tuple[tuple[float, ...], tuple[float, ...]]


def check_image_output(dtype: torch.dtype, normalize: Normalize | None) -> None:
    """Raise ``ValueError`` unless ``dtype`` is uint8 or a float dtype and ``normalize`` is None
    or three means and three non-zero stds."""
    if dtype != torch.uint8 and dtype not in FLOAT_DTYPES:
        raise ValueError(f"`dtype` must be torch.uint8, float32, float16 or bfloat16. Found: {dtype}.")
    if normalize is None:
        return
    try:
        mean, std = normalize
        ok = len(mean) == 3 and len(std) == 3 and all(s != 0 for s in std)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            "`normalize` must be ((m_r, m_g, m_b), (s_r, s_g, s_b)) with non-zero std, in "
            f"the 0-1 scale of torchvision's Normalize. Found: {shorten(normalize)}."
        )
    if any(abs(v) > 1 for v in (*mean, *std)):
        # The mean and std of images on the 0-1 scale cannot exceed 1: these are 0-255 figures,
        # which would give batches of mean about -2 and std about 0.1 without an error.
        warnings.warn(
            "`normalize` is applied to images on the 0-1 scale (as torchvision's Normalize after "
            "ToTensor), where no mean or std exceeds 1; these look like 0-255 values: divide "
            f"them by 255. Found: {shorten(normalize)}.",
            GpufeedWarning, stacklevel=1)  # one location: Python's default filter says it once


def scale_shift(normalize: Normalize) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (scale, shift) with ``x * scale + shift == (x / 255 - mean) / std``."""
    mean, std = normalize
    return tuple(1.0 / (255.0 * s) for s in std), tuple(-m / s for m, s in zip(mean, std))


def affine(
    normalize: Normalize, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scale_shift` as two (1, 3, 1, 1) tensors of ``dtype`` on ``device``, for NCHW."""
    scale, shift = scale_shift(normalize)
    return (torch.tensor(scale, dtype=dtype, device=device).view(1, 3, 1, 1),
            torch.tensor(shift, dtype=dtype, device=device).view(1, 3, 1, 1))


def to_float_(out: torch.Tensor, constants: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``out`` (a float NCHW batch holding the 0-255 values) converted in place and returned:
    ``x / 255`` without ``constants``, else ``x * scale + shift`` with ``constants`` from
    :func:`affine` of the same dtype and device."""
    if constants is None:
        return out.mul_(1.0 / 255.0)
    scale, shift = constants
    return out.mul_(scale).add_(shift)
