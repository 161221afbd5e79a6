"""The per-sample fast path: a loader over a ``DetectionSource`` with a ``DetectionPipeline``
runs read, decode, target, joint ops and output in its workers, with images of any size and any
``collate_fn``, and gives what ``torch.utils.data.DataLoader`` gives for the same work."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

import gpufeed
from gpufeed import FastLoader
from gpufeed.errors import DecodeError, GpufeedWarning
from tests.integration._batches import interrupted
from tests.integration._detection import (
    FilesDetection,
    Reference,
    assert_same,
    pipeline,
    tuple_collate,
    write_files,
)

pytestmark = pytest.mark.timeout(120)

N = 10


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("det") / "images", N)


@pytest.fixture(scope="module")
def same_size_records(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("det-same") / "images", 8, same_size=True)


def loader(records, num_workers=2, collate_fn=tuple_collate, **kw) -> FastLoader:
    kw.setdefault("generator", torch.Generator().manual_seed(5))
    return FastLoader(FilesDetection(records, pipeline()), batch_size=4, shuffle=True, seed=3,
                      num_workers=num_workers, collate_fn=collate_fn, **kw)


def reference(records, epochs=1, collate_fn=tuple_collate) -> list:
    """torch's batches of ``epochs`` passes (one loader: its generator goes on)."""
    ref = Reference(FilesDetection(records, pipeline()), seed=3, epoch=0)
    torch_loader = DataLoader(ref, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5),
                              collate_fn=collate_fn)
    out = []
    for epoch in range(epochs):
        ref.epoch = epoch
        out += list(torch_loader)
    return out


def test_batches_equal_torch_dataloaders_with_images_of_different_sizes(records):
    fast = loader(records)
    got = list(fast) + list(fast)
    assert_same(got, reference(records, epochs=2))
    images = got[0][0]
    assert len({tuple(im.shape) for im in images}) > 1  # different sizes in one batch
    assert all(im.dtype == torch.float32 and im.shape[0] == 3 for im in images)
    assert {tuple(t["masks"].shape[1:]) for t in got[0][1]} == {tuple(im.shape[1:]) for im in images}
    stats = fast.stats()
    assert stats["path"] == "image" and stats["path_reason"] is None
    assert stats["images"] == 2 * N and stats["overflow_bytes"] == 0
    assert stats["decode_s"] > 0 and stats["transform_s"] > 0


def test_default_collate_works_when_sizes_are_equal(same_size_records):
    fast = loader(same_size_records, collate_fn=default_collate)
    got = list(fast)
    want = reference(same_size_records, collate_fn=default_collate)
    assert_same(got, want)
    images, targets = got[0]
    assert images.shape == (4, 3, 40, 56) and targets["boxes"].shape == (4, 2, 4)
    assert fast.stats()["overflow_bytes"] == 0  # stacked in the slot by the workers' collate


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_the_batches_are_the_same_for_any_number_of_workers(records, num_workers):
    assert_same(list(loader(records, num_workers)), reference(records))


def test_images_are_written_into_the_arena_slot(records):
    fast = loader(records, num_workers=1)
    it = iter(fast)
    images, _ = next(it)
    arena = fast._arena
    spans = [(s.data_ptr(), s.data_ptr() + s.numel()) for s in map(arena.slot_tensor, range(arena.num_slots))]
    for image in images:
        assert any(lo <= image.data_ptr() < hi for lo, hi in spans)
    del it
    assert fast.stats()["overflow_bytes"] == 0


@pytest.mark.parametrize(("before", "after"), [(2, 2), (0, 3)])
def test_mid_epoch_resume_is_exact(records, before, after):
    full = list(loader(records, before))
    head, state = interrupted(loader(records, before), 1)
    assert_same(head, full[:1])
    resumed = loader(records, after)
    resumed.load_state_dict(state)
    assert_same(list(resumed), full[1:])


def test_a_worker_killed_mid_epoch_is_replaced_and_its_batch_rerun(records, tmp_path):
    source = FilesDetection(records, pipeline(), kill_at=(6,), marker_dir=str(tmp_path))
    fast = FastLoader(source, batch_size=4, shuffle=True, seed=3, num_workers=2, collate_fn=tuple_collate,
                      generator=torch.Generator().manual_seed(5))
    got = list(fast)
    assert_same(got, reference(records))
    assert sorted(t["image_id"] for _, targets in got for t in targets) == list(range(N))
    assert fast.stats()["worker_restarts"] == 1
    assert (tmp_path / "died-6").exists()  # the worker that read sample 6 was SIGKILLed


@pytest.fixture
def with_corrupt(records, tmp_path):
    bad = tmp_path / "corrupt.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all" * 3)
    out = [dict(r) for r in records]
    out[3] = {**out[3], "file": str(bad)}
    return out, str(bad)


@pytest.fixture
def with_cut_scan(records, tmp_path):
    """Sample 3's JPEG with its scan cut short and an EOI after it: the header reads, and the
    decode, deferred to the first op that reads pixels (``JpegRows``), fails."""
    data = open(records[3]["file"], "rb").read()
    sos = data.index(b"\xff\xda")
    bad = tmp_path / "cut.jpg"
    bad.write_bytes(data[:sos + 200] + b"\xff\xd9")
    out = [dict(r) for r in records]
    out[3] = {**out[3], "file": str(bad)}
    return out, str(bad)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("damage", ["with_corrupt", "with_cut_scan"])
def test_a_corrupt_jpeg_names_its_file_and_index(damage, num_workers, request):
    records, bad = request.getfixturevalue(damage)
    fast = FastLoader(FilesDetection(records, pipeline()), batch_size=4, num_workers=num_workers,
                      collate_fn=tuple_collate)
    with pytest.raises(DecodeError) as info:
        list(fast)
    assert bad in str(info.value) and "sample index 3" in str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("damage", ["with_corrupt", "with_cut_scan"])
def test_on_error_skip_leaves_the_sample_out_and_counts_it(damage, num_workers, caplog, request):
    records, bad = request.getfixturevalue(damage)
    fast = FastLoader(FilesDetection(records, pipeline()), batch_size=4, num_workers=num_workers,
                      collate_fn=tuple_collate, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        got = list(fast)
    ids = [t["image_id"] for _, targets in got for t in targets]
    assert ids == [i for i in range(N) if i != 3]
    assert len(got[0][0]) == 3
    stats = fast.stats()
    assert stats["skipped"] == 1 and stats["images"] == N - 1
    assert bad in caplog.text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_the_pipeline_carries_the_stage_index_and_file(records, num_workers):
    class Broken(FilesDetection):
        def target_of(self, index, record, canvas):
            if index == 2:
                raise KeyError("no such annotation")
            return super().target_of(index, record, canvas)

    fast = FastLoader(Broken(records, pipeline()), batch_size=4, num_workers=num_workers, collate_fn=tuple_collate)
    with pytest.raises(KeyError) as info:
        list(fast)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "target_of" in notes and "sample index 2" in notes and records[2]["file"] in notes


def test_an_error_in_the_collate_fn_names_the_batch(records):
    def bad_collate(batch):
        raise RuntimeError("collate failed")

    fast = FastLoader(FilesDetection(records, pipeline()), batch_size=4, num_workers=0, collate_fn=bad_collate)
    with pytest.raises(RuntimeError) as info:
        list(fast)
    notes = "\n".join(info.value.__notes__)
    assert "raised in collate_fn (test_an_error" in notes and "sample indices [0, 1, 2, 3]" in notes


def test_explain_and_stats_name_the_per_sample_path(records):
    fast = loader(records, num_workers=0)
    text = gpufeed.explain(fast)
    first, *rest = text.splitlines()
    assert first == "FastLoader: the image path (per sample: variable sizes, collate_fn in the workers)."
    assert "  fast: FlipH(p=0.5)" in rest
    assert "a baseline JPEG only down to the last row the ops read" in text
    assert "No host cache (cache_bytes=0)" in text
    assert "Host cache (cache_bytes='2MB')" in gpufeed.explain(loader(records, num_workers=0, cache_bytes="2MB"))
    assert fast.stats()["path"] == "image"
    torch_text = gpufeed.explain(DataLoader(fast.dataset, batch_size=2, collate_fn=tuple_collate))
    assert "would take the image path (per sample" in torch_text
    dataset_text = gpufeed.explain(fast.dataset)
    assert dataset_text.startswith("FilesDetection: per sample, in the workers") and "FlipH(p=0.5)" in dataset_text


def test_the_image_options_are_refused_with_the_fix(records):
    source = FilesDetection(records, pipeline())
    for option in ({"normalize": ((0.5,) * 3, (0.2,) * 3)}, {"dtype": torch.float16},
                   {"channels_last": True}):
        with pytest.raises(ValueError, match=f"`{next(iter(option))}`.*Normalize"):
            FastLoader(source, batch_size=2, collate_fn=tuple_collate, **option)


def test_a_source_without_a_pipeline_takes_the_generic_path_with_one_warning(records):
    source = FilesDetection(records, None)
    with pytest.warns(GpufeedWarning, match="generic path.*no `transforms`") as warned:
        fast = FastLoader(source, batch_size=2, collate_fn=tuple_collate)
    assert len(warned) == 1
    assert fast.stats()["path"] == "generic"
    with pytest.raises(ValueError, match="`seed` only applies to the fast path"):
        FastLoader(source, batch_size=2, seed=1)


def test_batch_size_none_is_blocked(records):
    with pytest.warns(GpufeedWarning, match="batch_size=None"):
        fast = FastLoader(FilesDetection(records, pipeline()), batch_size=None)
    assert fast.stats()["path"] == "generic"
