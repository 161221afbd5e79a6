"""The host cache on the per-sample path (``cache_bytes`` with a detection or segmentation
dataset): each sample's read (encoded bytes and record) is kept by the parent and handed to the
workers in the task's slot, so later epochs read nothing, and the batches are the ones an
uncached loader gives, through a killed worker, a small budget and ``num_workers=0``."""

from __future__ import annotations

import pytest
import torch

import gpufeed
from gpufeed import FastLoader
from gpufeed._synth_coco import make_coco, make_segmentation
from gpufeed.image.detection import DetectionPipeline
from gpufeed.image.detection._crops import RandomIoUCrop, RandomResizedCrop
from gpufeed.image.detection._geometry import RandomHorizontalFlip, Resize
from tests.integration._detection import FilesDetection, assert_same, pipeline, tuple_collate, write_files

pytestmark = pytest.mark.timeout(180)

N = 12
EPOCHS = 3


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("det-cache") / "images", N)


class CountedReads(FilesDetection):
    """``FilesDetection`` that counts its reads in a file per process (reads happen in workers)."""

    def __init__(self, records, transforms, log_dir: str, **kw) -> None:
        super().__init__(records, transforms, **kw)
        self.log_dir = log_dir

    def __repr__(self) -> str:  # the cache's fingerprint has the dataset's repr: one without an address
        return f"CountedReads({len(self)} samples)"

    def read_item(self, index: int):
        import os

        with open(os.path.join(self.log_dir, f"reads-{os.getpid()}"), "a") as f:
            f.write(f"{index}\n")
        return super().read_item(index)


def reads_logged(log_dir) -> list[int]:
    return sorted(int(line) for path in log_dir.glob("reads-*") for line in path.read_text().split())


def run(source, num_workers: int, cache_bytes=0, epochs: int = EPOCHS, **kw) -> tuple[list, dict]:
    fast = FastLoader(source, batch_size=4, shuffle=True, seed=3, num_workers=num_workers,
                      collate_fn=tuple_collate, cache_bytes=cache_bytes, persistent_workers=num_workers > 0,
                      generator=torch.Generator().manual_seed(5), **kw)
    out = [list(fast) for _ in range(epochs)]
    return out, fast.stats()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_later_epochs_read_nothing_and_give_the_uncached_batches(records, tmp_path, num_workers):
    want, _ = run(FilesDetection(records, pipeline()), num_workers)
    got, stats = run(CountedReads(records, pipeline(), str(tmp_path)), num_workers, cache_bytes="16MB")
    assert_same(got, want)
    assert reads_logged(tmp_path) == list(range(N))  # each sample read once, in epoch 0
    assert stats["cache_misses"] == N and stats["cache_hits"] == (EPOCHS - 1) * N
    assert stats["cache_bytes"] > 0 and stats["path"] == "image"


def test_a_budget_smaller_than_the_data_caches_some_and_changes_nothing(records):
    want, _ = run(FilesDetection(records, pipeline()), 2)
    one_sample = len(open(records[-1]["file"], "rb").read())
    got, stats = run(FilesDetection(records, pipeline()), 2, cache_bytes=3 * one_sample)
    assert_same(got, want)
    assert 0 < stats["cache_hits"] < (EPOCHS - 1) * N


def test_a_worker_killed_with_cached_samples_in_its_slot_is_rerun_exactly(records, tmp_path):
    want, _ = run(FilesDetection(records, pipeline()), 2)
    # sample 6 is read in epoch 0 (a miss) and kills its worker then; the re-run reads it again
    source = FilesDetection(records, pipeline(), kill_at=(6,), marker_dir=str(tmp_path))
    got, stats = run(source, 2, cache_bytes="16MB")
    assert_same(got, want)
    assert stats["worker_restarts"] == 1 and stats["cache_hits"] == (EPOCHS - 1) * N


class Unpicklable:
    """A record that does not pickle (a lock, say): the sample runs, uncached."""

    def __init__(self, record) -> None:
        import threading

        self.record, self.lock = record, threading.Lock()


class UnpicklableRecords(FilesDetection):
    def read_item(self, index: int):
        data, record = super().read_item(index)
        return data, Unpicklable(record)

    def target_of(self, index: int, record, canvas):
        return super().target_of(index, record.record, canvas)


def test_records_that_do_not_pickle_are_not_cached_and_change_nothing(records):
    want, _ = run(FilesDetection(records, pipeline()), 0, epochs=2)
    got, stats = run(UnpicklableRecords(records, pipeline()), 0, cache_bytes="16MB", epochs=2)
    assert_same(got, want)
    assert stats["cache_hits"] == 0 and stats["cache_bytes"] == 0


def test_cache_bytes_on_the_generic_path_is_an_error_naming_it(records):
    with pytest.raises(ValueError, match="`cache_bytes` only applies to the fast path.*no `transforms`"):
        FastLoader(FilesDetection(records, None), batch_size=2, cache_bytes="1MB")


def test_coco_and_segmentation_datasets_cached_equal_uncached(tmp_path):
    coco = make_coco(tmp_path / "coco", 10, seed=3, empty_fraction=0.0)
    seg = make_segmentation(tmp_path / "voc", 10, seed=5)
    datasets = {
        "coco": lambda: gpufeed.CocoDetection(
            coco.root, coco.ann_file, target_keys=["boxes", "labels", "masks", "image_id"],
            transforms=DetectionPipeline(ops=(RandomIoUCrop(), RandomHorizontalFlip(), Resize((64, 80))))),
        "segmentation": lambda: gpufeed.SegmentationDataset(
            seg.images, seg.masks, transforms=DetectionPipeline(ops=(RandomResizedCrop(48), RandomHorizontalFlip()))),
    }
    for name, make in datasets.items():
        want, _ = run(make(), 2, epochs=2)
        got, stats = run(make(), 2, cache_bytes="32MB", epochs=2)
        assert_same(got, want)
        assert stats["cache_hits"] == 10, name


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_jobs_host_cache_serves_a_second_loader_of_the_same_dataset(records, tmp_path, monkeypatch,
                                                                       num_workers):
    """With ``cache_scope="host"`` (a job found: ``GPUFEED_CACHE_JOB``), a second loader over the
    same dataset (another rank on the host, say) finds every sample the first one read."""
    import uuid

    monkeypatch.setenv("GPUFEED_CACHE_JOB", f"det-{uuid.uuid4().hex}")
    want, _ = run(FilesDetection(records, pipeline()), num_workers, epochs=1)
    loaders = [FastLoader(CountedReads(records, pipeline(), str(tmp_path)), batch_size=4, shuffle=True, seed=3,
                          num_workers=num_workers, collate_fn=tuple_collate, cache_bytes="16MB",
                          cache_scope="host", generator=torch.Generator().manual_seed(5))
               for _ in range(2)]  # both alive, as two ranks' loaders are
    first = list(loaders[0])
    second = list(loaders[1])
    assert loaders[0].stats()["cache_shared"] == 1 and loaders[0].stats()["cache_misses"] == N
    assert loaders[1].stats()["cache_hits"] == N  # the first loader's reads
    assert reads_logged(tmp_path) == list(range(N))
    assert_same(first, want[0])
    assert_same(second, want[0])


def test_a_corrupt_file_is_cached_as_read_and_skipped_every_epoch(records, tmp_path):
    """``on_error="skip"`` with a cache: the bad file's bytes are cached like any read, and it
    is left out (and counted) in every epoch, as without the cache."""
    bad = tmp_path / "corrupt.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all" * 3)
    broken = [dict(r) for r in records]
    broken[3] = {**broken[3], "file": str(bad)}
    want, plain = run(FilesDetection(broken, pipeline()), 2, on_error="skip")
    got, stats = run(FilesDetection(broken, pipeline()), 2, cache_bytes="16MB", on_error="skip")
    assert_same(got, want)
    assert stats["skipped"] == plain["skipped"] == EPOCHS
    assert stats["cache_hits"] == (EPOCHS - 1) * N
