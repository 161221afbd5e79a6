"""Everything gpufeed does with CUDA: page-locking arena slots, the loader's one copy stream,
handing device batches to the consumer stream, and the GPU-side image transform.

Users reach it through ``FastLoader(..., device="cuda")`` and ``ImageBatcher(device="cuda")``;
the one public name here is :class:`GpuTransform`, the dtype, layout and normalize step the
loader runs on the consumer stream after the copy, usable on any uint8 image batch on a device.
The feed (``CudaFeed``), its page-locking (``HostRegistrar``) and the torch calls it goes
through (``CudaOps``) are private. docs/design/cuda-feed.md describes the lifecycle.

Importing this package starts nothing: no CUDA context, no stream.
"""

from gpufeed.cuda._transform import GpuTransform

__all__ = ["GpuTransform"]
