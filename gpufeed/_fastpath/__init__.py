"""The loader's image fast path on the parent side: the engine plugin that plans image batches
from a gpufeed source (``feed``: cache look-ups, the GPU-side transform) and the ``num_workers=0``
image iterator (``local``).

It sits above ``gpufeed.sources`` (it reads them) and ``gpufeed.image`` (whose fill it runs), and
below ``gpufeed.loader``; docs/design/layers.md.
"""
