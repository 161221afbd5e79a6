"""Host waits on the device outside the feed: the doctor's timed training step."""

from __future__ import annotations

import torch


def wait_for_device() -> None:
    """Block until the current device has run everything queued on it, when this process has
    initialized CUDA (never initializes it): a timed step then measures the GPU's time, not
    the kernel launches'."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
