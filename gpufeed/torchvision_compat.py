"""torchvision pipelines on the image fast path (public names; the code is in
``gpufeed._image.torchvision``)."""

from gpufeed._image.torchvision import (
    OpRoute,
    TorchvisionPipeline,
    explain,
    from_torchvision,
    is_torchvision,
    translate_or_none,
)

__all__ = [
    "OpRoute",
    "TorchvisionPipeline",
    "explain",
    "from_torchvision",
    "is_torchvision",
    "translate_or_none",
]
