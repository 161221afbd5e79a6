"""Map-style torch datasets of encoded images for gpufeed's image fast path.

Every source is an :class:`ImageSource`: ``read(i)`` (encoded bytes), ``label(i)``,
``describe(i)`` (for messages) and ``transform``; ``__getitem__`` returns (uint8 CHW tensor,
label), or the result of a callable ``transform`` given a PIL image, so sources also work under
``torch.utils.data.DataLoader``.

Detection and segmentation sources are :class:`DetectionSource` s (:class:`CocoDetection`,
:class:`SegmentationDataset`): ``read_item(i)`` gives (encoded bytes, record) and
``target_of(i, record, (H, W))`` the target, whose boxes and masks move with the image through a
:class:`~gpufeed.image.detection.DetectionPipeline`; ``__getitem__`` returns what torchvision's
dataset wrapped by ``wrap_dataset_for_transforms_v2`` returns.

:func:`pack` writes an image folder (or dataset) into one LMDB file for :class:`LMDBDataset`;
:func:`pack_tar` writes it as WebDataset tar shards with sidecar indexes for :class:`TarShards`
(``gpufeed pack`` and ``gpufeed pack --format tar`` on the command line).
"""

from gpufeed.sources._base import ImageSource
from gpufeed.sources._coco import CocoDetection
from gpufeed.sources._detection import DetectionSource
from gpufeed.sources._folder import IMG_EXTENSIONS, ImageFolder
from gpufeed.sources._pack import PackResult, pack
from gpufeed.sources._packed import LMDBDataset
from gpufeed.sources._remote import RemoteOptions
from gpufeed.sources._segmentation import SegmentationDataset
from gpufeed.sources._tar import TarIndexReport, TarShards
from gpufeed.sources._tar_writer import TarPackResult, pack_tar
from gpufeed.sources._wrapped import ImageDataset

__all__ = [
    "CocoDetection",
    "DetectionSource",
    "IMG_EXTENSIONS",
    "ImageDataset",
    "ImageFolder",
    "ImageSource",
    "LMDBDataset",
    "PackResult",
    "RemoteOptions",
    "SegmentationDataset",
    "TarIndexReport",
    "TarPackResult",
    "TarShards",
    "pack",
    "pack_tar",
]
