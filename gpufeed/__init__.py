"""gpufeed: keeps GPUs fed.

A drop-in replacement for ``torch.utils.data.DataLoader`` on gpufeed's own shared-memory worker
engine. Importing gpufeed starts nothing: no processes, threads or CUDA context.
"""

from gpufeed.loader import FastLoader

__all__ = ["FastLoader"]
__version__ = "0.1.0"
