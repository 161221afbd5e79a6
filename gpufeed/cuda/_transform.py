"""The GPU-side image transform: dtype, layout and normalize applied on the consumer stream
after the copy (``gpufeed.cuda._feed.CudaFeed`` calls ``apply``; docs/design/cuda-feed.md).

What has run: ``apply`` on CPU tensors, which gives the CPU path's numbers exactly
(``tests/unit/test_normalize.py``); on a CUDA device it has not run yet (``tests/gpu`` skips
without CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpufeed.image._normalize import Normalize, affine, check_image_output, convert_, work_dtype


@dataclass(frozen=True)
class GpuTransform:
    """What the consumer stream does to image batches after the copy: dtype, layout, normalize
    (the arithmetic of the CPU path: ``gpufeed.image._normalize``)."""

    dtype: torch.dtype = torch.uint8
    normalize: Normalize | None = None
    channels_last: bool = False
    # device -> (scale, shift) in work_dtype(self.dtype): built once per device, since torch.tensor(...,
    # device=cuda) is a host-to-device copy that blocks the host, too slow for every batch
    _constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_image_output(self.dtype, self.normalize)

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` (uint8 NCHW, any memory format) in ``dtype``, normalized; uint8 unchanged."""
        if self.dtype == torch.uint8:
            return images
        out = torch.empty_like(images, dtype=self.dtype)  # keeps the memory format
        return convert_(out, images, self.constants(images.device))

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(scale, shift) on ``device`` for ``normalize``, the same tensors at every call; None
        without ``normalize``."""
        if self.normalize is None:
            return None
        found = self._constants.get(device)
        if found is None:
            # two threads (ImageBatcher's) may both build them: the first stored is every thread's
            found = self._constants.setdefault(device, affine(self.normalize, work_dtype(self.dtype), device))
        if device.type == "cuda":  # kept across batches: used on whichever stream is current
            stream = torch.cuda.current_stream(device)
            for t in found:
                t.record_stream(stream)
        return found
