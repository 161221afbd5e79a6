"""benchmarks/tar_shards.py stays runnable: its generated index-scale shards are valid tars, and
its webdataset pipeline yields the same labels and geometry as TarShards."""

from __future__ import annotations

import importlib.util
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from gpufeed import ResizeCenterCrop, TarShards
from gpufeed.sources import pack_tar
from gpufeed.synth import make_image_folder

ROOT = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tar_shards_bench", ROOT / "benchmarks" / "tar_shards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_index_scale_shards_are_tars_tarshards_and_tarfile_read(tmp_path: Path) -> None:
    shards = bench().write_scale_shards(tmp_path, 2500, per_shard=1000)
    assert len(shards) == 3
    with tarfile.open(shards[2]) as tf:
        assert tf.getnames()[:2] == ["000002000.jpg", "000002000.cls"] and len(tf.getnames()) == 1000
    ds = TarShards(shards, transform=ResizeCenterCrop(8, 8))
    assert len(ds) == 2500 and ds.label(1999) == 999 and tuple(ds[2400][0].shape) == (3, 8, 8)


@pytest.mark.timeout(60)
def test_webdataset_pipeline_matches_tarshards_labels_and_shape(tmp_path: Path) -> None:
    pytest.importorskip("webdataset", reason="webdataset is a dev dependency")
    make_image_folder(tmp_path / "src", num_classes=2, per_class=5, size=(60, 70), seed=1)
    shards = list(pack_tar(tmp_path / "src", tmp_path / "out", shard_bytes=8000,
                               progress=False).shards)
    geometry = ResizeCenterCrop(32, 40)
    ours = TarShards(shards, transform=geometry)
    for decoder in ("pil", "cv2"):
        images, labels = next(iter(bench().wds_loader(shards, geometry, decoder, 10, 0)))
        assert labels.tolist() == ours.targets
        assert images.shape == (10, 3, 32, 32) and images.dtype == torch.float32
