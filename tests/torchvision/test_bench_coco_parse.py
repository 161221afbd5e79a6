"""benchmarks/coco_parse.py stays runnable: its generated file is a valid COCO file that gpufeed
and pycocotools read alike, and a tiny run builds all three datasets, each in its own process.

Real torchvision and pycocotools (``make test`` runs this folder in ``.venv-tv``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torchvision", reason="torchvision is not installed in this venv; `make test` runs "
                    "tests/torchvision in .venv-tv")
pytest.importorskip("pycocotools", reason="pycocotools is not installed in this venv (.venv-tv has it)")

import gpufeed  # noqa: E402
from benchmarks import coco_parse  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_the_generated_file_reads_alike_in_gpufeed_and_pycocotools(tmp_path):
    from pycocotools.coco import COCO

    ann = tmp_path / "ann.json"
    coco_parse.write_annotations(ann, images=30, annotations=400, seed=1)
    raw = json.loads(ann.read_text())
    assert len(raw["images"]) == 30 and len(raw["annotations"]) == 400
    assert any(a["iscrowd"] for a in raw["annotations"])  # some list-count RLEs
    theirs = COCO(str(ann))
    ours = gpufeed.CocoDetection(tmp_path, ann, target_keys=["boxes", "labels", "segmentation"])
    assert list(ours.ids) == sorted(theirs.imgs)
    for i, image_id in enumerate(ours.ids):
        anns = theirs.loadAnns(theirs.getAnnIds(imgIds=image_id, iscrowd=None))
        target = ours.target_of(i, ours.record(i), (480, 640))
        assert target.get("segmentation", []) == [a["segmentation"] for a in anns]
        assert np.array_equal(np.asarray(target.get("labels", [])), [a["category_id"] for a in anns])


def test_a_tiny_run_builds_every_dataset_in_its_own_process(tmp_path, capsys):
    assert coco_parse.main([str(tmp_path), "--images", "20", "--annotations", "150", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for name in coco_parse.BUILDERS:
        line = next(row for row in out.splitlines() if row.startswith(name))
        seconds, peak, kept = line[len(name):].split()[:3]
        assert float(seconds) >= 0 and float(peak[:-2]) > 0 and float(kept[:-2]) > 0
    with pytest.raises(SystemExit):
        coco_parse.main([str(tmp_path), "--builders", "nope"])
