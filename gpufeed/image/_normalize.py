"""The values of an image batch: its dtype and ``normalize``, checked in one place and computed
as one per-channel multiply-add.

``(x / 255 - mean) / std`` is applied as ``x * scale + shift`` with ``scale = 1 / (255 * std)``
and ``shift = -mean / std`` (one pass over the batch instead of three). Without ``normalize`` a
float batch is ``x / 255``. The CPU fill (``gpufeed.image._fill``) and the GPU transform
(``gpufeed.cuda._transform.GpuTransform``) both convert through :func:`convert_`, so the two paths give
the same numbers.

:func:`convert_` is the whole batch's conversion, uint8 rows to the output dtype. It computes in
float32 (float64 for float64 output) and rounds once to the output dtype, and it works in the
batch's memory order, a chunk of images at a time:

- memory order: a channels_last batch is (n, H, W * 3) in memory, so the per-channel constants
  are repeated into one (W * 3,) row; broadcasting a (1, 3, 1, 1) constant over it instead makes
  torch's innermost loop the 3 channels (no SIMD): measured 31 ms vs 9 ms for NCHW on a 64 x 224
  x 224 float32 batch, one thread (65-83 ms for float16/bfloat16), which cost channels_last
  float output about 20% of the end-to-end rate;
- chunks of about ``_CHUNK_BYTES`` of float32 (one 224 x 224 image): the three passes (convert,
  multiply, add) stay in the core's L2 cache instead of going through memory three times;
- float16/bfloat16 through a float32 scratch chunk: torch's half-precision arithmetic on CPU
  converts to float and back at every operation (uint8 -> float16 alone took 5.9 ms per batch);
  one conversion at the end costs less and rounds once.

Measured (64 x 224 x 224 batch, one thread, minimum of 12 interleaved runs, shared 2-core EPYC):
3.6-4.5 ms for every layout and dtype, against 5.1 ms (float32 NCHW) to 31-83 ms
(channels_last) before.
"""

from __future__ import annotations

import warnings

import torch

from gpufeed.errors import GpufeedWarning, shorten

__all__ = ["FLOAT_DTYPES", "Normalize", "affine", "check_image_output", "convert_", "memory_rows",
           "scale_shift", "work_dtype"]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# Float32 bytes per chunk of :func:`convert_` on CPU: about one 224 x 224 image (602 KB), which
# with its uint8 rows fits a 1 MB L2 cache. Whole 64-image batches: 5.1-9.3 ms; per image: 3.6-4.4.
_CHUNK_BYTES = 640 * 1024

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


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype :func:`convert_` computes in for an output of ``dtype``: float64 for float64,
    float32 otherwise (float16/bfloat16 are rounded once, from float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def convert_(out: torch.Tensor, images: torch.Tensor,
             constants: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Write ``images`` (uint8, shape (n, 3, H, W)) into ``out`` (a float tensor of that shape;
    fastest when both are NCHW-contiguous or both channels_last) as ``x / 255`` (``constants`` None) or
    ``x * scale + shift`` (``constants``: :func:`affine` in :func:`work_dtype` of ``out``'s dtype,
    on ``out``'s device); computed in that work dtype and rounded once to ``out``'s. Returns ``out``.

    On CPU it works a chunk of images at a time in memory order (module docstring); on other
    devices over the whole batch at once.
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"`images` must be a uint8 (n, 3, H, W) tensor. "
                         f"Found: {images.dtype} {tuple(images.shape)}.")
    if out.shape != images.shape:
        raise ValueError(f"`out` must have the shape of `images`, {tuple(images.shape)}. "
                         f"Found: {tuple(out.shape)}.")
    views = memory_rows(out, images, constants)
    work = work_dtype(out.dtype)
    if views is None:  # other strides: one pass each
        y = images.to(work)
        if constants is None:
            y.mul_(1.0 / 255.0)
        else:
            y.mul_(constants[0].view(1, 3, 1, 1)).add_(constants[1].view(1, 3, 1, 1))
        return out.copy_(y)
    src, dst, scale, shift = views
    n = src.shape[0]
    if n == 0:
        return out
    per_image = src.shape[1] * src.shape[2] * work.itemsize
    step = n if out.device.type != "cpu" else max(1, _CHUNK_BYTES // per_image)
    scratch = None
    if out.dtype != work:
        scratch = torch.empty((min(step, n), *src.shape[1:]), dtype=work, device=out.device)
    for i in range(0, n, step):
        x = src[i:i + step]
        y = dst[i:i + step] if scratch is None else scratch[:len(x)]
        y.copy_(x)
        if scale is None or shift is None:
            y.mul_(1.0 / 255.0)
        else:
            y.mul_(scale).add_(shift)
        if scratch is not None:
            dst[i:i + step].copy_(y)
    return out


def memory_rows(out: torch.Tensor, images: torch.Tensor, constants: tuple[torch.Tensor, torch.Tensor] | None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """``images`` and ``out`` (both (n, 3, H, W)) as (n, a, b) views in memory order, with the
    per-channel constants shaped to broadcast over one (a, b) image: NCHW is (n, 3, H * W) with
    (3, 1) constants, channels_last (n, H, W * 3) with (1, W * 3) ones (module docstring). None
    when the two are not both NCHW-contiguous or both channels_last."""
    n, _, h, w = images.shape
    if _is_channels_last(images) and _is_channels_last(out):
        src = images.permute(0, 2, 3, 1).view(n, h, w * 3)
        dst = out.permute(0, 2, 3, 1).view(n, h, w * 3)
        if constants is None:
            return src, dst, None, None
        scale, shift = (c.reshape(3).repeat(w).view(1, w * 3) for c in constants)
        return src, dst, scale, shift
    if not (images.is_contiguous() and out.is_contiguous()):
        return None
    src, dst = images.view(n, 3, h * w), out.view(n, 3, h * w)
    if constants is None:
        return src, dst, None, None
    return src, dst, constants[0].reshape(3, 1), constants[1].reshape(3, 1)


def _is_channels_last(t: torch.Tensor) -> bool:
    """True for a 4-d tensor whose memory is NHWC (and not also NCHW-contiguous: H = W = 1)."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
