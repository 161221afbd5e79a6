"""Where payloads start inside an arena slot: every region begins on an ``ALIGN_BYTES`` boundary.

The engine's ``SlotWriter.alloc`` and the image path's slot layout (``ImagePlan.layout``)
both place regions with :func:`align_up`, so a tensor viewed at any region start is aligned for
every dtype and for vector loads (64 bytes: one cache line, one AVX-512 register).
"""

from __future__ import annotations

ALIGN_BYTES = 64


def align_up(n: int) -> int:
    """``n`` rounded up to the next multiple of :data:`ALIGN_BYTES`."""
    return (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
