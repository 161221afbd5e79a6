"""User-supplied keypoints (``gpufeed.image.detection.KeyPoints`` from a ``DetectionSource``)
through a translated torchvision v2 pipeline and a ``FastLoader`` with workers: they arrive as
``tv_tensors.KeyPoints`` with their canvas, equal to torchvision's own result on the same
decoded image and targets within 1e-3 px, as do the boxes."""

from __future__ import annotations

import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision.transforms.v2 as T  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed.decoders import decode, read_header  # noqa: E402
from gpufeed.image import stored_orientation  # noqa: E402
from tests.integration._detection import write_files  # noqa: E402
from tests.torchvision._keypoints import KeypointFiles, keypoints_of  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def zip_collate(batch):
    return tuple(zip(*batch))


def test_keypoints_follow_the_image_through_the_loader_as_torchvision_moves_them(tmp_path):
    records = write_files(tmp_path / "images", 8)
    pipeline = T.Compose([T.ToImage(), T.RandomHorizontalFlip(p=1.0), T.Resize((48, 64)),
                          T.ClampKeyPoints(), T.ToDtype(torch.float32, scale=True)])
    dataset = KeypointFiles(records, pipeline)
    assert isinstance(dataset.transforms, gpufeed.image.detection.DetectionPipeline)
    loader = gpufeed.FastLoader(dataset, batch_size=3, num_workers=2, collate_fn=zip_collate)
    got = [(img, t) for imgs, targets in loader for img, t in zip(imgs, targets)]
    assert len(got) == len(records)
    for (img, target), record in zip(got, records):
        data = open(record["file"], "rb").read()
        image = decode(data, header=stored_orientation(read_header(data)))
        h, w = image.shape[:2]
        boxes = np.asarray(record["boxes"])
        want_img, want = pipeline(
            tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1)),
            {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32), format="XYXY",
                                               canvas_size=(h, w)),
             "keypoints": tv_tensors.KeyPoints(torch.tensor(keypoints_of(boxes), dtype=torch.float32),
                                               canvas_size=(h, w)),
             "labels": torch.tensor(record["labels"])})
        assert type(target["keypoints"]) is tv_tensors.KeyPoints
        assert target["keypoints"].canvas_size == want["keypoints"].canvas_size == (48, 64)
        torch.testing.assert_close(target["keypoints"].as_subclass(torch.Tensor),
                                   want["keypoints"].as_subclass(torch.Tensor), atol=1e-3, rtol=0)
        torch.testing.assert_close(target["boxes"].as_subclass(torch.Tensor),
                                   want["boxes"].as_subclass(torch.Tensor), atol=1e-3, rtol=0)
        assert type(img) is tv_tensors.Image and img.shape == want_img.shape
        assert float((img - want_img).abs().mean()) * 255 < 1.5
