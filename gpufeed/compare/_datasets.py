"""Cheap synthetic datasets for transport benchmarks: the sample costs little to make, so the
benchmark measures how batches travel from workers to the main process, not how they are made."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

__all__ = ["SyntheticImageDataset"]


class SyntheticImageDataset(Dataset[torch.Tensor]):
    """Map-style dataset of ``uint8`` tensors of one shape (default 3x224x224, 147 KiB each).

    Sample ``i`` is a fresh tensor filled with ``i % 256`` (one memset), so a batch can be checked
    (``batch[k, 0, 0, 0] == index % 256``) and nothing is shared between samples.

    Args:
        length: number of samples.
        shape: shape of each sample (C, H, W).
    """

    def __init__(self, length: int, shape: tuple[int, ...] = (3, 224, 224)) -> None:
        if length < 0:
            raise ValueError(f"`length` must be >= 0. Found: {length}.")
        if not shape or any(d <= 0 for d in shape):
            raise ValueError(f"`shape` must be non-empty with positive sizes. Found: {shape}.")
        self.length = int(length)
        self.shape = tuple(int(d) for d in shape)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for a dataset of {self.length}")
        return torch.full(self.shape, index % self.length % 256, dtype=torch.uint8)

    @property
    def sample_bytes(self) -> int:
        """Bytes in one sample."""
        n = 1
        for d in self.shape:
            n *= d
        return n
