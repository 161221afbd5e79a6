"""A ``torch.utils.data.Subset`` of a gpufeed dataset (``random_split``'s, nested ones, the
detection references' "images with annotations" one) takes the fast path of the dataset under
it: the batches are the base dataset's for the same base indices, for any ``num_workers``,
cached or not, and after a mid-epoch resume. And ``CocoDetection`` answers what the detection
references ask of a dataset (``coco``, ``get_height_and_width``) without decoding."""

from __future__ import annotations

import json
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import Sampler, Subset, random_split

import gpufeed
from gpufeed._synth_coco import make_coco
from gpufeed.image.detection import DetectionPipeline
from gpufeed.image.detection._crops import RandomIoUCrop
from gpufeed.image.detection._geometry import RandomHorizontalFlip, Resize
from gpufeed.synth import make_image_folder
from tests.integration._batches import interrupted, same
from tests.integration._detection import FilesDetection, assert_same, pipeline, tuple_collate, write_files

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    make_image_folder(root, num_classes=3, per_class=10, size=((40, 90), (50, 100)))
    return gpufeed.ImageFolder(root, transform=gpufeed.RandomResizedCrop(32))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco"), 16, seed=4, empty_fraction=0.3)


def _no_generic_path_warning(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        return make()


def _split(folder):
    train, val = random_split(folder, [0.7, 0.3], generator=torch.Generator().manual_seed(0))
    return train, val


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_random_split_subset_takes_the_image_path_with_the_base_datasets_batches(folder, num_workers):
    train, _ = _split(folder)
    nested = Subset(train, list(range(len(train)))[::-1])  # a Subset of a Subset
    base = [train.indices[i] for i in nested.indices]
    for subset, indices in ((train, list(train.indices)), (nested, base)):
        fast = _no_generic_path_warning(lambda s=subset: gpufeed.FastLoader(
            s, batch_size=4, num_workers=num_workers, seed=3))
        got = list(fast)
        assert fast.stats()["path"] == "image"
        want = list(gpufeed.FastLoader(folder, batch_size=4, num_workers=num_workers, seed=3,
                                       sampler=indices))
        assert same(got, want)
        assert torch.equal(torch.cat([labels for _, labels in got]),
                           torch.tensor([folder.targets[i] for i in indices]))


def test_the_whole_range_as_a_subset_gives_the_datasets_batches(folder):
    every = Subset(folder, range(len(folder)))
    kw = dict(batch_size=5, shuffle=True, seed=1, num_workers=2)
    got = list(gpufeed.FastLoader(every, generator=torch.Generator().manual_seed(7), **kw))
    assert same(got, list(gpufeed.FastLoader(folder, generator=torch.Generator().manual_seed(7), **kw)))


def test_a_subset_loader_resumes_exactly_and_caches_by_base_index(folder):
    train, _ = _split(folder)

    def loader(num_workers, **kw):
        return gpufeed.FastLoader(train, batch_size=3, shuffle=True, seed=5, num_workers=num_workers,
                                  generator=torch.Generator().manual_seed(2), **kw)

    full = list(loader(2))
    head, state = interrupted(loader(2), 2)
    resumed = loader(0)
    resumed.load_state_dict(state)
    assert same(head + list(resumed), full)
    cached = loader(2, cache_bytes=64 << 20, persistent_workers=True)
    epochs = [list(cached), list(cached)]
    assert cached.stats()["cache_hits"] > 0
    uncached = loader(2, persistent_workers=True)
    assert all(same(a, b) for a, b in zip(epochs, [list(uncached), list(uncached)]))


def test_a_subsets_decoded_cache_makes_batches_in_the_parent_with_the_base_labels(folder):
    deterministic = gpufeed.ImageFolder(folder.root, transform=gpufeed.ResizeCenterCrop(24, 28))
    subset = Subset(deterministic, [7, 3, 25, 11, 0, 19])
    cached = gpufeed.FastLoader(subset, batch_size=3, num_workers=2, cache_bytes=64 << 20, persistent_workers=True)
    first, second = list(cached), list(cached)  # the second epoch: every row a hit, made in the parent
    assert cached.stats()["cache_hits"] >= len(subset)
    want = list(gpufeed.FastLoader(deterministic, batch_size=3, sampler=subset.indices))
    assert same(first, want) and same(second, want)
    assert torch.cat([labels for _, labels in second]).tolist() == [deterministic.targets[i] for i in subset.indices]


def test_a_subset_index_out_of_range_is_an_index_error_naming_it(folder):
    with pytest.raises(IndexError, match=f"hold {len(folder) + 3}, outside its dataset of {len(folder)}"):
        gpufeed.FastLoader(Subset(folder, [0, len(folder) + 3]), batch_size=2)
    negative = Subset(folder, [-1, 0])  # counted from the end, as folder[-1]
    got = list(gpufeed.FastLoader(negative, batch_size=2, seed=0))
    assert same(got, list(gpufeed.FastLoader(folder, batch_size=2, seed=0, sampler=[len(folder) - 1, 0])))


def test_explain_and_the_generic_path_warning_see_through_the_subset(folder):
    train, _ = _split(folder)
    assert gpufeed.explain(train).startswith("ImageFolder's transform:")
    with pytest.warns(gpufeed.GpufeedWarning, match="custom collate_fn"):
        gpufeed.FastLoader(train, batch_size=2, collate_fn=lambda b: b)


# -- the detection references' use: Subset of images with annotations, grouped batches ------------

def ssd_like() -> DetectionPipeline:
    return DetectionPipeline(ops=(RandomIoUCrop(), RandomHorizontalFlip(), Resize((64, 80))))


class AspectGroups(Sampler):
    """Batches of ``size`` indices whose images are all wider than tall, or all not (the
    references' ``GroupedBatchSampler`` with two groups), from ``get_height_and_width``."""

    def __init__(self, dataset, size: int) -> None:
        heights_widths = [_height_width(dataset, i) for i in range(len(dataset))]
        self.groups = [[i for i, (h, w) in enumerate(heights_widths) if (w > h) == wide] for wide in (True, False)]
        self.size = size

    def __iter__(self):
        for group in self.groups:
            for k in range(0, len(group), self.size):
                yield group[k:k + self.size]

    def __len__(self) -> int:
        return sum(-(-len(g) // self.size) for g in self.groups)


def _height_width(dataset, i):
    if isinstance(dataset, Subset):  # as the references' compute_aspect_ratios does
        return _height_width(dataset.dataset, dataset.indices[i])
    return dataset.get_height_and_width(i)


def with_annotations(dataset):
    """The references' ``_coco_remove_images_without_annotations``, through ``dataset.coco``."""
    keep = [k for k, image_id in enumerate(dataset.ids)
            if dataset.coco.loadAnns(dataset.coco.getAnnIds(imgIds=image_id, iscrowd=None))]
    return Subset(dataset, keep)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_references_subset_and_grouped_batches_take_the_per_sample_path(coco, num_workers):
    pytest.importorskip("pycocotools")
    dataset = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=ssd_like(),
                                    target_keys=["boxes", "labels", "image_id"])
    train = with_annotations(dataset)
    assert 0 < len(train) < len(dataset)
    fast = _no_generic_path_warning(lambda: gpufeed.FastLoader(
        train, batch_sampler=AspectGroups(train, 3), num_workers=num_workers, collate_fn=tuple_collate, seed=8))
    got = list(fast)
    assert fast.stats()["path"] == "image"
    assert gpufeed.explain(fast).splitlines()[0].startswith("FastLoader: the image path (per sample")
    base_batches = [[train.indices[i] for i in batch] for batch in AspectGroups(train, 3)]
    want = list(gpufeed.FastLoader(dataset, batch_sampler=base_batches, num_workers=num_workers,
                                   collate_fn=tuple_collate, seed=8))
    assert_same(got, want)
    ids = [t["image_id"] for _, targets in got for t in targets]
    assert sorted(ids) == sorted(dataset.ids[i] for i in train.indices)
    assert all(len(t["boxes"]) >= 0 for _, targets in got for t in targets)


def test_coco_answers_height_and_width_without_decoding_and_keeps_coco_out_of_pickles(coco, tmp_path):
    pytest.importorskip("pycocotools")
    dataset = gpufeed.CocoDetection(coco.root, coco.ann_file)
    for i in (0, 5):
        width, height = dataset[i][0].size  # PIL: (W, H)
        assert dataset.get_height_and_width(i) == (height, width)
    size_before = len(pickle.dumps(dataset))
    assert set(dataset.coco.getImgIds()) == set(dataset.ids)
    assert len(pickle.dumps(dataset)) == size_before  # the COCO object stays in this process
    assert pickle.loads(pickle.dumps(dataset)).coco.getImgIds() == dataset.coco.getImgIds()
    data = json.loads(open(coco.ann_file).read())
    for img in data["images"]:
        del img["height"], img["width"]
    bare = tmp_path / "no_sizes.json"
    bare.write_text(json.dumps(data))
    no_sizes = gpufeed.CocoDetection(coco.root, bare)
    assert [no_sizes.get_height_and_width(i) for i in range(4)] == \
        [dataset.get_height_and_width(i) for i in range(4)]
    assert np.all(np.array([dataset.get_height_and_width(i) for i in range(len(dataset))]) > 0)


def test_a_worker_killed_mid_epoch_reruns_the_subsets_batch_on_base_indices(tmp_path):
    records = write_files(tmp_path / "files", 12)
    keep = [11, 0, 9, 2, 7, 4, 5, 3]  # base index 7 kills its worker at its first read
    killing = Subset(FilesDetection(records, pipeline(), kill_at=(7,), marker_dir=str(tmp_path)), keep)
    fast = gpufeed.FastLoader(killing, batch_size=3, num_workers=2, collate_fn=tuple_collate, seed=2)
    got = list(fast)
    assert fast.stats()["worker_restarts"] == 1 and (tmp_path / "died-7").exists()
    assert [t["image_id"] for _, targets in got for t in targets] == keep
    plain = gpufeed.FastLoader(FilesDetection(records, pipeline()), batch_size=3, sampler=keep,
                               collate_fn=tuple_collate, seed=2)
    assert_same(got, list(plain))
