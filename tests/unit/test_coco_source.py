"""CocoDetection and SegmentationDataset without torchvision: the annotation file parsed into flat
arrays, read_item/target_of, lazy COCO masks against pycocotools' full decode, the pipeline path,
and errors naming the file (and the JSON key)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

pycocotools_mask = pytest.importorskip("pycocotools.mask", reason="pycocotools is a dependency")

import gpufeed  # noqa: E402
from gpufeed._synth_coco import make_coco, make_segmentation, palette_png  # noqa: E402
from gpufeed.image.detection import Boxes, DetectionPipeline, Mask  # noqa: E402
from gpufeed.sources import CocoDetection, DetectionSource, SegmentationDataset  # noqa: E402
from gpufeed.sources._coco_masks import CocoPlanes, rle_counts, segmentation_rle  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco"), 40, seed=3, crowd_fraction=0.2,
                     string_rle_fraction=0.15)


def _json(coco):
    return json.loads(coco.ann_file.read_text())


def test_exported_from_gpufeed_and_gpufeed_sources():
    assert gpufeed.CocoDetection is CocoDetection and gpufeed.SegmentationDataset is SegmentationDataset
    assert issubclass(CocoDetection, DetectionSource) and issubclass(SegmentationDataset, DetectionSource)


def test_images_in_sorted_id_order_with_their_annotations_in_file_order(coco):
    raw = _json(coco)
    ds = CocoDetection(coco.root, coco.ann_file)
    ids = sorted(img["id"] for img in raw["images"])
    assert ds.ids == ids and len(ds) == len(ids)
    name = {img["id"]: img["file_name"] for img in raw["images"]}
    for i, image_id in enumerate(ids):
        anns = [a for a in raw["annotations"] if a["image_id"] == image_id]
        data, record = ds.read_item(i)
        assert ds.describe(i) == str(coco.root / name[image_id])
        assert data == (coco.root / name[image_id]).read_bytes()
        target = ds.target_of(i, record, (500, 600))
        if not anns:
            assert target == {"image_id": image_id}
            continue
        assert list(target) == ["image_id", "boxes", "labels"]
        boxes = target["boxes"]
        assert isinstance(boxes, Boxes) and boxes.format == "XYXY" and boxes.canvas == (500, 600)
        xywh = np.array([a["bbox"] for a in anns], dtype=np.float64)
        np.testing.assert_allclose(boxes.data, np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
                                   rtol=1e-6)
        assert torch.equal(target["labels"], torch.tensor([a["category_id"] for a in anns]))


def test_all_keys_give_the_json_values_back(coco):
    raw = _json(coco)
    ds = CocoDetection(coco.root, coco.ann_file, target_keys="all")
    for i, image_id in enumerate(ds.ids):
        anns = [a for a in raw["annotations"] if a["image_id"] == image_id]
        if not anns:
            continue
        canvas = next((im["height"], im["width"]) for im in raw["images"] if im["id"] == image_id)
        target = ds.target_of(i, ds.record(i), canvas)
        for key in ("segmentation", "area", "iscrowd", "bbox", "category_id"):
            assert target[key] == [a[key] for a in anns], key
        assert isinstance(target["masks"], Mask) and target["masks"].lazy is not None


def test_lazy_masks_equal_pycocotools_full_decode(coco):
    raw = _json(coco)
    ds = CocoDetection(coco.root, coco.ann_file, target_keys=["masks"])
    rng = np.random.default_rng(0)
    kinds = set()
    for i, image_id in enumerate(ds.ids):
        anns = [a for a in raw["annotations"] if a["image_id"] == image_id]
        if not anns:
            continue
        h, w = next((im["height"], im["width"]) for im in raw["images"] if im["id"] == image_id)
        mask = ds.target_of(i, ds.record(i), (h, w))["masks"]
        full = np.stack([pycocotools_mask.decode(segmentation_rle(a["segmentation"], (h, w))) for a in anns])
        kinds |= {type(a["segmentation"]).__name__ + str(type(a["segmentation"]).__name__ == "dict"
                                                        and type(a["segmentation"]["counts"]).__name__)
                  for a in anns}
        assert np.array_equal(mask.lazy.pixels(np.arange(h), np.arange(w)), full)
        rows = rng.integers(0, h, rng.integers(1, h))
        cols = np.sort(rng.integers(0, w, rng.integers(1, w)))[::-1]
        assert np.array_equal(mask.lazy.pixels(rows, cols), full[:, rows][:, :, cols])
        mask.select(np.arange(-3, h // 2), np.arange(w - 1, 5, -2))  # pad, flip and subsample
        expect = np.zeros((len(anns), h // 2 + 3, len(range(w - 1, 5, -2))), np.uint8)
        expect[:, 3:] = full[:, : h // 2][:, :, w - 1:5:-2]
        assert np.array_equal(mask.dense(), expect)
    assert kinds == {"listFalse", "dictstr", "dictlist"}  # polygons, compressed and plain RLE


def test_rle_runs_on_random_masks_and_polygons():
    rng = np.random.default_rng(1)
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        dense = np.asfortranarray((rng.random((h, w)) < rng.random()).astype(np.uint8))
        polys = [list(rng.uniform(-5, max(h, w) + 5, 2 * int(rng.integers(3, 12)))) for _ in range(3)]
        rles = [pycocotools_mask.encode(dense), segmentation_rle(polys, (h, w)),
                segmentation_rle({"counts": [0, h * w], "size": [h, w]}, (h, w))]
        for rle in rles:
            assert rle_counts(rle["counts"]).sum() == h * w
        planes = CocoPlanes(rles, (h, w))
        full = np.stack([pycocotools_mask.decode(r) for r in rles])
        rows, cols = rng.integers(0, h, 17), rng.integers(0, w, 9)  # few pixels: searched
        assert np.array_equal(planes.pixels(rows, cols), full[:, rows][:, :, cols])
        rows, cols = np.arange(h)[::-1], np.arange(w // 3, w)  # most of their columns: expanded
        assert np.array_equal(planes.pixels(rows, cols), full[:, rows][:, :, cols])
        assert planes.shape == (3, h, w)


def test_an_rle_of_another_size_than_the_image_is_an_error():
    rle = pycocotools_mask.encode(np.zeros((4, 5), np.uint8, order="F"))
    with pytest.raises(ValueError, match="4x5"):
        CocoPlanes([rle], (6, 5))


def test_the_pickled_dataset_is_flat_and_smaller_than_the_json(tmp_path):
    coco = make_coco(tmp_path, 600, size=((40, 60), (40, 60)), max_objects=10, seed=5)
    ds = CocoDetection(coco.root, coco.ann_file, target_keys="all")
    assert coco.num_annotations > 2000
    blob = pickle.dumps(ds)
    assert len(blob) < coco.ann_file.stat().st_size
    back = pickle.loads(blob)
    size = {im["id"]: (im["height"], im["width"]) for im in _json(coco)["images"]}
    for i in range(0, len(ds), 37):
        canvas = size[ds.ids[i]]
        a, b = ds.target_of(i, ds.record(i), canvas), back.target_of(i, back.record(i), canvas)
        assert list(a) == list(b) and a.get("segmentation") == b.get("segmentation")
        if "masks" in a:
            assert np.array_equal(a["masks"].dense(), b["masks"].dense())
    assert {k for k, v in vars(ds).items() if isinstance(v, (dict, list))} == set()


def test_the_pipeline_path_decodes_with_gpufeed_and_builds_tensors(coco):
    ds = CocoDetection(coco.root, coco.ann_file, target_keys=["boxes", "masks", "labels"],
                       transforms=DetectionPipeline(image_dtype=torch.uint8))
    raw = _json(coco)
    for i in range(len(ds)):
        image, target = ds[i]
        image_id = ds.ids[i]
        h, w = next((im["height"], im["width"]) for im in raw["images"] if im["id"] == image_id)
        assert image.dtype == torch.uint8 and image.shape == (3, h, w)
        if "masks" in target:
            assert target["masks"].shape == (len(target["labels"]), h, w)
            assert target["masks"].dtype == torch.uint8 and target["boxes"].shape[1] == 4


def test_a_callable_gets_the_pil_image_and_target(coco):
    seen = []
    ds = CocoDetection(coco.root, coco.ann_file, transforms=lambda img, tgt: seen.append((img, tgt)) or 7)
    assert ds[0] == 7 and seen[0][0].mode == "RGB"
    only = CocoDetection(coco.root, coco.ann_file, transform=lambda img: img.size,
                         target_transform=lambda tgt: sorted(tgt))
    size, keys = only[1]
    assert len(size) == 2 and "image_id" in keys
    with pytest.raises(ValueError, match="Only `transforms`"):
        CocoDetection(coco.root, coco.ann_file, transform=abs, transforms=max)


def test_errors_name_the_file_and_the_key(tmp_path, coco):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not a valid JSON"):
        CocoDetection(tmp_path, bad)
    raw = _json(coco)
    raw["annotations"][3]["bbox"] = [1, 2, 3]
    bad.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"bad.json: `annotations\[3\].bbox`"):
        CocoDetection(tmp_path, bad)
    raw = _json(coco)
    del raw["images"][2]["file_name"]
    bad.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"bad.json: `images\[2\].file_name`"):
        CocoDetection(tmp_path, bad)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        CocoDetection(tmp_path, tmp_path / "nowhere.json")
    with pytest.raises(ValueError, match="not available"):
        CocoDetection(coco.root, coco.ann_file, target_keys=["boxes", "polygons"])
    ds = CocoDetection(tmp_path, coco.ann_file)  # images are not under tmp_path
    with pytest.raises(FileNotFoundError) as info:
        ds[0]
    assert ds.describe(0) in str(info.value) + "".join(getattr(info.value, "__notes__", []))


def _first_polygon(raw):
    """(annotation index, the annotation) of the first one with polygons."""
    return next((j, a) for j, a in enumerate(raw["annotations"]) if isinstance(a["segmentation"], list))


@pytest.mark.parametrize("bad", ["12.5", None, [1.0, 2.0], {"x": 1}])
def test_a_polygon_coordinate_that_is_not_a_number_is_named(tmp_path, coco, bad):
    # the coordinates are checked in bulk (numpy's inferred dtype); the error still names the entry
    raw = _json(coco)
    j, ann = _first_polygon(raw)
    ann["segmentation"][0][3] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"bad.json: `annotations\[{j}\].segmentation` must be a list of polygons"):
        CocoDetection(tmp_path, path)


def test_polygon_coordinates_of_any_json_number_parse_as_before(tmp_path, coco):
    # booleans (a JSON number to Python's isinstance), integers, and integers past 64 bits: the
    # bulk check leaves them to the per-value path, which takes them as numbers
    raw = _json(coco)
    j, ann = _first_polygon(raw)
    poly = ann["segmentation"][0]
    poly[:4] = [True, 7, 2**70, -(2**65)]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(raw))
    ds = CocoDetection(coco.root, path, target_keys=["segmentation"])  # no masks of such polygons
    i = ds.ids.index(ann["image_id"])
    segs = ds.target_of(i, ds.record(i), (1, 1))["segmentation"]
    assert [1.0, 7.0, float(2**70), -float(2**65)] in [p[:4] for s in segs for p in s]


def test_chunked_parsing_gives_the_same_tables_and_names_entries_in_later_chunks(tmp_path, coco, monkeypatch):
    from gpufeed.sources import _coco_parse

    raw = _json(coco)
    whole = _coco_parse.parse_annotations("a.json", json.loads(json.dumps(raw)))
    monkeypatch.setattr(_coco_parse, "CHUNK", 3)  # the JSON's entries flushed (and dropped) 3 at a time
    data = json.loads(json.dumps(raw))
    chunked = _coco_parse.parse_annotations("a.json", data)
    assert data["annotations"] == [None] * len(raw["annotations"])
    for name in ("ids", "sizes", "offsets", "bbox", "bbox_int", "category", "iscrowd", "area", "area_int",
                 "missing", "kind", "seg_lo", "seg_hi", "seg_size", "coords", "poly_off", "rle_blob"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    j = [k for k, a in enumerate(raw["annotations"]) if isinstance(a["segmentation"], list)][-1]
    raw["annotations"][j]["segmentation"][-1][0] = "x"
    with pytest.raises(ValueError, match=rf"`annotations\[{j}\].segmentation`"):
        _coco_parse.parse_annotations("a.json", raw)


def test_the_collector_is_paused_while_the_file_is_parsed_and_restored_after(coco, monkeypatch):
    import gc

    from gpufeed.sources import _coco_parse

    seen = []
    real = _coco_parse.parse_annotations
    monkeypatch.setattr("gpufeed.sources._coco.parse_annotations",
                        lambda *a: seen.append(gc.isenabled()) or real(*a))
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            CocoDetection(coco.root, coco.ann_file)
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False]


def test_segmentation_pairs_by_stem_and_masks_as_palette_indices(tmp_path):
    from PIL import Image

    seg = make_segmentation(tmp_path, 6, seed=4)
    by_dir = SegmentationDataset(seg.images, seg.masks)
    by_list = SegmentationDataset(list(seg.image_paths), list(seg.mask_paths))
    assert by_dir.images == by_list.images == [str(p) for p in seg.image_paths]
    for i in range(len(by_dir)):
        data, record = by_dir.read_item(i)
        indices = np.array(Image.open(seg.mask_paths[i]))
        assert Image.open(seg.mask_paths[i]).mode == "P" and 255 in indices
        mask = by_dir.target_of(i, record, indices.shape)
        assert isinstance(mask, Mask) and mask.dense().shape == (1, *indices.shape)
        assert np.array_equal(mask.dense()[0], indices)
        image, target = by_list[i]
        assert image.mode == "RGB" and image.size == indices.shape[::-1]
        assert torch.equal(torch.as_tensor(target)[0], torch.from_numpy(indices))
        out_image, out_mask = SegmentationDataset(by_list.images, by_list.masks,
                                                  DetectionPipeline(image_dtype=torch.uint8))[i]
        assert out_image.shape == (3, *indices.shape) and torch.equal(out_mask[0], torch.from_numpy(indices))


def test_segmentation_errors_name_the_files(tmp_path):
    seg = make_segmentation(tmp_path / "voc", 3, seed=4)
    seg.mask_paths[1].unlink()
    with pytest.raises(FileNotFoundError, match="2007_000001.jpg"):
        SegmentationDataset(seg.images, seg.masks)
    with pytest.raises(ValueError, match="same length"):
        SegmentationDataset(list(seg.image_paths), list(seg.mask_paths[:1]))
    small = tmp_path / "small.png"
    small.write_bytes(palette_png(np.zeros((3, 4), np.uint8)))
    ds = SegmentationDataset([seg.image_paths[0]], [small])
    with pytest.raises(gpufeed.DecodeError, match="small.png of sample index 0 is 4x3") as info:
        ds.target_of(0, ds.read_item(0)[1], (10, 10))
    assert isinstance(info.value, ValueError) and "on_error='skip'" in str(info.value)


def _as_list(batch):
    return batch


@pytest.mark.timeout(180)
def test_spawned_dataloader_workers_get_the_same_samples(coco):
    ds = CocoDetection(coco.root, coco.ann_file, target_keys=["boxes", "labels", "masks"],
                       transforms=DetectionPipeline(image_dtype=torch.uint8))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=_as_list,
                                         multiprocessing_context="spawn", timeout=120)
    got = [sample for batch in loader for sample in batch]
    assert len(got) == len(ds)
    for i, (image, target) in enumerate(got):
        expect_image, expect_target = ds[i]
        assert torch.equal(image, expect_image) and list(target) == list(expect_target)
        for key in target:
            assert torch.equal(torch.as_tensor(target[key]), torch.as_tensor(expect_target[key]))


def _targets(ds):
    return [ds.target_of(i, ds.record(i), (1, 1)) for i in range(len(ds))]


def test_the_index_cache_keeps_the_tables_until_the_file_changes(tmp_path, coco, monkeypatch):
    from gpufeed.sources import _coco

    keys = ["boxes", "labels", "segmentation", "area", "iscrowd"]
    cache = tmp_path / "coco.npz"
    built = CocoDetection(coco.root, coco.ann_file, target_keys=keys, index_cache=cache)
    assert cache.exists()
    real = _coco.parse_annotations

    def refuse(*args):
        raise AssertionError("parsed again")

    monkeypatch.setattr(_coco, "parse_annotations", refuse)
    hit = CocoDetection(coco.root, coco.ann_file, target_keys=keys, index_cache=cache)
    assert list(hit.ids) == list(built.ids)
    assert [hit.describe(i) for i in range(len(hit))] == [built.describe(i) for i in range(len(built))]
    mine, theirs = _targets(hit), _targets(built)
    for a, b in zip(mine, theirs, strict=True):
        assert list(a) == list(b) and a.get("segmentation") == b.get("segmentation")
        assert a.get("area") == b.get("area") and a.get("iscrowd") == b.get("iscrowd")
    # the same size and time, other bytes: the digest tells them apart
    raw = _json(coco)
    raw["annotations"][0]["category_id"] = 91 if raw["annotations"][0]["category_id"] != 91 else 92
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(raw))
    monkeypatch.setattr(_coco, "parse_annotations", real)
    changed = CocoDetection(coco.root, edited, target_keys=["labels"], index_cache=cache)
    image = changed.ids.index(raw["annotations"][0]["image_id"])
    labels = changed.target_of(image, changed.record(image), (1, 1))["labels"].tolist()
    assert raw["annotations"][0]["category_id"] in labels


def test_a_damaged_index_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, coco):
    from gpufeed.sources import _coco_cache
    from gpufeed.sources._index_cache import IndexCacheWarning

    cache = tmp_path / "coco.npz"
    cache.write_bytes(b"not an npz")
    with pytest.warns(IndexCacheWarning, match="not a valid gpufeed-coco"):
        CocoDetection(coco.root, coco.ann_file, index_cache=cache)
    digest = _coco_cache.file_digest(str(coco.ann_file))
    assert _coco_cache.load_tables(str(cache), digest) is not None  # rewritten
    arrays = dict(np.load(cache))
    arrays["category"] = arrays["category"][:-1]  # tables that do not add up
    np.savez(cache, **arrays)
    with pytest.warns(IndexCacheWarning, match="table category"):
        assert _coco_cache.load_tables(str(cache), digest) is None


def test_the_index_cache_stores_every_table():
    import dataclasses

    from gpufeed.sources import _coco_cache
    from gpufeed.sources._coco_parse import CocoTables

    assert {f.name for f in dataclasses.fields(CocoTables)} == {*_coco_cache._LAYOUT, "files"}


def test_ranks_without_a_cache_wait_for_the_one_building_it(tmp_path, coco, monkeypatch):
    import fcntl
    import os
    import threading
    import types

    from gpufeed.sources import _coco_cache
    from gpufeed.sources._coco_parse import parse_annotations, read_json

    cache = str(tmp_path / "coco.npz")
    ann = str(coco.ann_file)
    digest = _coco_cache.file_digest(ann)
    parsed = []

    def parse():
        parsed.append(1)
        return parse_annotations(ann, read_json(ann))

    holder = os.open(cache + ".lock", os.O_CREAT | os.O_RDWR)  # another rank, building
    fcntl.flock(holder, fcntl.LOCK_EX)
    polling = threading.Event()
    clock = _coco_cache.time  # the module's view of it only, not time.sleep for the process
    monkeypatch.setattr(_coco_cache, "time", types.SimpleNamespace(
        monotonic=clock.monotonic, sleep=lambda s: (polling.set(), clock.sleep(s))))
    got = []
    waiter = threading.Thread(target=lambda: got.append(_coco_cache.cached_tables(cache, ann, parse)))
    waiter.start()
    assert polling.wait(30), "the second rank did not wait on the lock"
    _coco_cache.save_tables(cache, digest, parse_annotations(ann, read_json(ann)))  # the holder's
    os.close(holder)
    waiter.join(30)
    assert not waiter.is_alive() and parsed == [] and np.array_equal(got[0].category, parse().category)


def test_a_builder_that_dies_releases_the_lock_and_a_stuck_one_is_outwaited(tmp_path, coco):
    import os
    import subprocess
    import sys

    from gpufeed.sources import _coco_cache
    from gpufeed.sources._coco_parse import parse_annotations, read_json

    cache = str(tmp_path / "coco.npz")
    ann = str(coco.ann_file)
    code = ("import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code, cache + ".lock"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        parsed = []
        tables = _coco_cache.cached_tables(cache, ann, lambda: parsed.append(1) or parse_annotations(
            ann, read_json(ann)), wait_s=0.0)  # a live holder, no patience: built here too
        assert parsed == [1] and len(tables.ids) == len(_json(coco)["images"])
        os.remove(cache)
        child.kill()
        child.wait(30)
        _coco_cache.cached_tables(cache, ann, lambda: parsed.append(2) or parse_annotations(ann, read_json(ann)))
        assert parsed == [1, 2] and os.path.exists(cache)  # the killed holder's lock went with it
    finally:
        child.kill()
        child.wait(30)
        child.stdout.close()
