"""A test-only detection dataset (JPEGs of different sizes, boxes + labels + a dense mask per
image), a test-only joint op (a seeded horizontal flip), and the reference that does the same
work per sample for ``torch.utils.data.DataLoader``. Module level, so workers can import them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from gpufeed.decoders import decode, read_header
from gpufeed.image._transforms import stored_orientation
from gpufeed.image.detection import Boxes, DetectionPipeline, JointOp, Mask, Sample
from gpufeed.image.detection._sample import map_leaves, sample_rng
from gpufeed.sources._detection import DetectionSource


class FlipH(JointOp):
    """A horizontal flip with probability ``p`` of the image, the boxes and the masks."""

    name = "RandomHorizontalFlip"

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return True if rng.random() < self.p else None

    def apply(self, sample: Sample, params: Any) -> Sample:
        w = sample.image.shape[1]

        def leaf(x: Any) -> Any:
            if isinstance(x, Boxes):
                data = x.data.copy()
                data[:, [0, 2]] = w - x.data[:, [2, 0]]
                return Boxes(data, x.format, x.canvas, x.clamping_mode, x.dtype)
            if isinstance(x, Mask):
                x.select(None, np.arange(w)[::-1])
            return x

        return Sample(np.ascontiguousarray(sample.image[:, ::-1]), map_leaves(sample.target, leaf))

    def __repr__(self) -> str:
        return f"FlipH(p={self.p})"


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """A photo-like BGR image: smooth gradients and a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    chans = [127 + 100 * np.sin(x / (7 + 3 * c + seed % 5) + c) * np.cos(y / (9 + c)) for c in range(3)]
    img = np.stack(chans, -1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_files(root: Path, n: int, same_size: bool = False) -> list[dict[str, Any]]:
    """``n`` JPEGs under ``root`` (of different sizes unless ``same_size``) and their records."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        h, w = (40, 56) if same_size else (36 + 5 * i, 48 + 3 * (i % 4))
        ok, enc = cv2.imencode(".jpg", photo(h, w, i), [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        path = root / f"img{i:03d}.jpg"
        path.write_bytes(enc.tobytes())
        k = 2 if same_size else 1 + i % 3
        x0 = rng.uniform(0, w / 2, k)
        y0 = rng.uniform(0, h / 2, k)
        boxes = np.stack([x0, y0, x0 + rng.uniform(2, w / 2, k), y0 + rng.uniform(2, h / 2, k)], 1)
        records.append({"file": str(path), "boxes": boxes.tolist(), "labels": rng.integers(1, 9, k).tolist()})
    return records


class FilesDetection(DetectionSource):
    """Detection samples from ``records`` (``write_files``). ``kill_at``: indices whose first
    read SIGKILLs the reading worker (once each: a marker file in ``marker_dir``)."""

    def __init__(self, records: list[dict[str, Any]], transforms: Any = None,
                 kill_at: tuple[int, ...] = (), marker_dir: str | None = None) -> None:
        self.records = records
        self.transforms = transforms
        self.kill_at, self.marker_dir = set(kill_at), marker_dir

    def __len__(self) -> int:
        return len(self.records)

    def read_item(self, index: int) -> tuple[bytes, Any]:
        if index in self.kill_at and self.marker_dir is not None:
            marker = Path(self.marker_dir) / f"died-{index}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(5)  # not reached
        record = self.records[index]
        return Path(record["file"]).read_bytes(), record

    def target_of(self, index: int, record: Any, canvas: tuple[int, int]) -> Any:
        h, w = canvas
        boxes = Boxes(np.asarray(record["boxes"]), "XYXY", canvas)
        masks = np.zeros((len(boxes), h, w), np.uint8)
        for plane, (x0, y0, x1, y1) in zip(masks, boxes.data.astype(int)):
            plane[y0:y1, x0:x1] = 1
        return {"boxes": boxes, "labels": torch.tensor(record["labels"], dtype=torch.int64),
                "masks": Mask(masks), "image_id": index}

    def describe(self, index: int) -> str:
        return self.records[index]["file"]


def pipeline(**kw: Any) -> DetectionPipeline:
    return DetectionPipeline(ops=(FlipH(0.5),), **kw)


class Reference(Dataset):
    """What the per-sample path does, sample by sample, for torch's DataLoader."""

    def __init__(self, source: FilesDetection, seed: int, epoch: int) -> None:
        self.source, self.seed, self.epoch = source, seed, epoch

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        data, record = self.source.read_item(index)
        image = decode(data, header=stored_orientation(read_header(data)))
        target = self.source.target_of(index, record, image.shape[:2])
        pipe = self.source.transforms
        sample = pipe.run(Sample(image, target), sample_rng(self.seed, self.epoch, index))
        return pipe.output(sample)


def tuple_collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch))


def assert_same(got: Any, want: Any) -> None:
    """Equal structure, types, tensor dtypes and values (and tv_tensors' metadata)."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
        assert got.__dict__ == want.__dict__
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, np.ndarray):
        assert np.array_equal(got, want)
    else:
        assert got == want
