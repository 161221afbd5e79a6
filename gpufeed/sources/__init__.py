"""Map-style torch datasets of encoded images for gpufeed's image fast path.

Every source is an :class:`ImageSource`: ``read(i)`` (encoded bytes), ``label(i)``,
``describe(i)`` (for messages) and ``transform``; ``__getitem__`` returns (uint8 CHW tensor,
label), or the result of a callable ``transform`` given a PIL image, so sources also work under
``torch.utils.data.DataLoader``.

:func:`pack` writes an image folder (or dataset) into one LMDB file for :class:`LMDBDataset`;
:func:`pack_tar` writes it as WebDataset tar shards with sidecar indexes for :class:`TarShards`
(``gpufeed pack`` and ``gpufeed pack --format tar`` on the command line).
"""

from gpufeed.sources._base import ImageSource
from gpufeed.sources._folder import IMG_EXTENSIONS, ImageFolder
from gpufeed.sources._pack import PackResult, pack
from gpufeed.sources._packed import LMDBDataset
from gpufeed.sources._remote import RemoteOptions
from gpufeed.sources._tar import TarIndexReport, TarShards
from gpufeed.sources._tar_writer import TarPackResult, pack_tar
from gpufeed.sources._wrapped import ImageDataset

__all__ = [
    "IMG_EXTENSIONS",
    "ImageDataset",
    "ImageFolder",
    "ImageSource",
    "LMDBDataset",
    "PackResult",
    "RemoteOptions",
    "TarIndexReport",
    "TarPackResult",
    "TarShards",
    "pack",
    "pack_tar",
]
