"""Datasets that misbehave on purpose, shared by the fault tests (module level: picklable)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset, IterableDataset


class SquareGrids(Dataset):
    """Deterministic samples: (i, i*i as a 3x4 float tensor)."""

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return i, torch.full((3, 4), float(i * i))


class DiesOnce(SquareGrids):
    """Kills its own worker with ``sig`` the first time it loads each index in ``at``.

    A marker file per index makes the death happen once, so the replacement succeeds.
    """

    def __init__(self, n: int, at: tuple[int, ...], marker_dir: str, sig: int = signal.SIGKILL) -> None:
        super().__init__(n)
        self.at, self.marker_dir, self.sig = set(at), marker_dir, sig

    def __getitem__(self, i: int):
        if i in self.at:
            marker = Path(self.marker_dir) / f"died-{i}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), self.sig)
                time.sleep(5)  # not reached for SIGKILL/SIGSEGV
        return super().__getitem__(i)


class AlwaysDies(SquareGrids):
    def __getitem__(self, i: int):
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class StreamThatDies(IterableDataset):
    def __iter__(self):
        for i in range(100):
            if i == 7:
                os.kill(os.getpid(), signal.SIGKILL)
            yield torch.tensor(i)


class Slow(SquareGrids):
    def __init__(self, n: int, delay_s: float) -> None:
        super().__init__(n)
        self.delay_s = delay_s

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)
        return super().__getitem__(i)


class Marked(SquareGrids):
    """Leaves an empty file named after each index it loads in ``marker_dir``: the test sees
    which samples the workers have fetched (a clock-free way to wait for them)."""

    def __init__(self, n: int, marker_dir: str) -> None:
        super().__init__(n)
        self.marker_dir = marker_dir

    def __getitem__(self, i: int):
        (Path(self.marker_dir) / str(i)).touch()
        return super().__getitem__(i)


class BadSampleError(Exception):
    """An exception whose constructor takes two arguments (does not round-trip through pickle)."""

    def __init__(self, path: str, code: int) -> None:
        super().__init__(f"cannot read {path} (code {code})")
        self.path, self.code = path, code


class RaisesAt(SquareGrids):
    def __init__(self, n: int, at: int, exc: str = "key") -> None:
        super().__init__(n)
        self.at, self.exc = at, exc

    def __getitem__(self, i: int):
        if i == self.at:
            if self.exc == "key":
                raise KeyError(f"sample {i} missing")
            raise BadSampleError(f"/data/{i}.jpg", 7)
        return super().__getitem__(i)


class Big(Dataset):
    """Samples of ``mb`` MiB each, so batches outgrow a small /dev/shm."""

    def __init__(self, n: int, mb: int) -> None:
        self.n, self.mb = n, mb

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((self.mb, 1024, 1024), i % 251, dtype=torch.uint8)


def segmentation_pairs(root: Path, n: int, seed: int) -> tuple:
    """``n`` synthetic image + mask pairs in ``root`` as a ``SegmentationDataset`` on gpufeed's
    path (uint8 output, no op): (dataset, ``SynthSegmentation``, every sample as it reads now),
    for tests that then damage some of the files."""
    from gpufeed._synth_coco import make_segmentation
    from gpufeed.image.detection import DetectionPipeline
    from gpufeed.sources import SegmentationDataset

    seg = make_segmentation(root, n, seed=seed)
    ds = SegmentationDataset(list(seg.image_paths), list(seg.mask_paths),
                             transforms=DetectionPipeline(image_dtype=torch.uint8))
    return ds, seg, [ds[i] for i in range(len(ds))]
