"""A test-only detection source whose targets carry user keypoints (module level, so workers
import it): the JPEGs and boxes of ``tests.integration._detection.write_files``, and two
keypoints per box (its corners' midpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufeed.image.detection import Boxes, KeyPoints
from gpufeed.sources import DetectionSource


def keypoints_of(boxes: np.ndarray) -> np.ndarray:
    """(N, 2, 2): for each XYXY box, the middle of its top edge and of its left edge."""
    x0, y0, x1, y1 = boxes.T
    return np.stack([np.stack([(x0 + x1) / 2, y0], 1), np.stack([x0, (y0 + y1) / 2], 1)], 1)


class KeypointFiles(DetectionSource):
    def __init__(self, records: list[dict[str, Any]], transforms: Any = None) -> None:
        self.records = records
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.records)

    def read_item(self, index: int) -> tuple[bytes, Any]:
        record = self.records[index]
        return Path(record["file"]).read_bytes(), record

    def target_of(self, index: int, record: Any, canvas: tuple[int, int]) -> Any:
        boxes = np.asarray(record["boxes"], dtype=np.float64)
        return {"boxes": Boxes(boxes, "XYXY", canvas),
                "keypoints": KeyPoints(keypoints_of(boxes), canvas),
                "labels": torch.tensor(record["labels"], dtype=torch.int64)}

    def describe(self, index: int) -> str:
        return self.records[index]["file"]
