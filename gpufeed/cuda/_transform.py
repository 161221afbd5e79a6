"""The GPU-side image transform: dtype, layout and normalize applied on the consumer stream
after the copy (``gpufeed.cuda._feed.CudaFeed`` calls ``apply``; docs/design/cuda-feed.md).

What has run: ``apply`` on CPU tensors, which gives the CPU path's numbers exactly
(``tests/unit/test_normalize.py``); on a CUDA device it has not run yet (``tests/gpu`` skips
without CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpufeed.image._batch_ops import BatchOp
from gpufeed.image._normalize import Normalize, affine, check_image_output, convert_, work_dtype


@dataclass(frozen=True)
class GpuTransform:
    """What the consumer stream does to image batches after the copy: dtype, layout, normalize
    (the arithmetic of the CPU path: ``gpufeed.image._normalize``), then the batch op (MixUp,
    CutMix) with the parameters the worker drew, and its soft targets, built on the device from
    the int64 labels."""

    dtype: torch.dtype = torch.uint8
    normalize: Normalize | None = None
    channels_last: bool = False
    batch_op: BatchOp | None = None
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

    def apply_batch(self, batch: Any) -> Any:
        """A host batch as copied to the device, ``(images, targets)`` (or ``(images, labels,
        params)`` with a batch op), made the batch the user gets: ``(images, targets)`` with
        the images converted and, with a batch op, mixed (``BatchOp.mix_``) and the targets
        soft; a ``MultiView``'s image part, a list of view batches, converted view by view (the
        normalize constants are shared). Python numbers only reach the device ops: the host never
        waits on the device."""
        if isinstance(batch[0], list):  # a MultiView (never with a batch op)
            return ([self.apply(v) for v in batch[0]], *batch[1:])
        images = self.apply(batch[0])
        if self.batch_op is None or len(batch) < 3:
            return (images, *batch[1:])
        labels, params = batch[1], batch[2]
        self.batch_op.mix_(images, params)
        return images, self.batch_op.soft_targets(labels, params)

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
