"""gpufeed: keeps GPUs fed.

A drop-in replacement for ``torch.utils.data.DataLoader`` on gpufeed's own shared-memory worker
engine, with an image fast path (decode, crop and resize straight into shared batch slots).
Importing gpufeed starts nothing: no processes, threads, decoders or CUDA context.
"""

from gpufeed.cache import HostCache, parse_cache_bytes
from gpufeed.decoders import backends, decode, read_header
from gpufeed.doctor import diagnose
from gpufeed.errors import (
    BackendFallbackWarning,
    BackendUnavailableError,
    DecodeError,
    GpufeedError,
    GpufeedWarning,
    LoaderTimeoutError,
    WorkerError,
)
from gpufeed.image import MultiView, RandomResizedCrop, ResizeCenterCrop, TorchvisionPipeline, from_torchvision
from gpufeed.loader import FastLoader, explain
from gpufeed.sampler import DistributedSampler
from gpufeed.sources import (
    CocoDetection,
    ImageDataset,
    ImageFolder,
    ImageSource,
    LMDBDataset,
    SegmentationDataset,
    TarShards,
    pack,
    pack_tar,
)

__all__ = [
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "CocoDetection",
    "DecodeError",
    "DistributedSampler",
    "FastLoader",
    "GpufeedError",
    "GpufeedWarning",
    "HostCache",
    "ImageDataset",
    "ImageFolder",
    "ImageSource",
    "LMDBDataset",
    "LoaderTimeoutError",
    "MultiView",
    "RandomResizedCrop",
    "ResizeCenterCrop",
    "SegmentationDataset",
    "TarShards",
    "TorchvisionPipeline",
    "WorkerError",
    "backends",
    "decode",
    "diagnose",
    "explain",
    "from_torchvision",
    "pack",
    "pack_tar",
    "parse_cache_bytes",
    "read_header",
]
__version__ = "0.1.0"

# Submodules used as ``gpufeed.tune.tune(...)`` / ``gpufeed.doctor.diagnose(...)`` after a plain
# ``import gpufeed``: imported on first access (PEP 562), so ``import gpufeed`` stays light.
_LAZY_SUBMODULES = frozenset({"doctor", "tune"})


def __getattr__(name: str) -> object:
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"gpufeed.{name}")
    raise AttributeError(f"module 'gpufeed' has no attribute {name!r}")
