"""Map-style torch datasets of encoded images for gpufeed's image fast path.

Every source is an :class:`ImageSource`: ``read(i)`` (encoded bytes), ``label(i)``,
``describe(i)`` (for messages) and ``transform``; ``__getitem__`` returns (uint8 CHW tensor,
label), or the result of a callable ``transform`` given a PIL image, so sources also work under
``torch.utils.data.DataLoader``.
"""

from gpufeed.sources._base import ImageSource
from gpufeed.sources._pack import PackResult, pack
from gpufeed.sources.folder import IMG_EXTENSIONS, ImageFolder
from gpufeed.sources.packed import LMDBDataset
from gpufeed.sources.remote import RemoteOptions
from gpufeed.sources.tar import TarIndexReport, TarShards
from gpufeed.sources.wrapped import ImageDataset

__all__ = [
    "IMG_EXTENSIONS",
    "ImageDataset",
    "ImageFolder",
    "ImageSource",
    "LMDBDataset",
    "PackResult",
    "RemoteOptions",
    "TarIndexReport",
    "TarShards",
    "pack",
]
