"""gpufeed.integrations.accelerate with the real HF Accelerate, under torchrun (2 CPU ranks, gloo).

One torchrun run (``_accelerate_script.py``) covers: training shards (disjoint, complete, batches
made by gpufeed's workers), gather_for_metrics at the end of an eval epoch (no duplicates),
accumulate() syncing at the loader's end, split_batches, an IterableDataset, a
gpufeed.DistributedSampler kept (not sharded twice), the image path's options, the warning of a
plain ``accelerator.prepare(fast_loader)``, the host cache shared by the prepared loaders of
both ranks, save_state/load_state resuming mid-epoch, and an image-path state resuming byte for
byte with another num_workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._concurrent import result as run_result
from tests._folders import ImageFolders

from ._torchrun import result, torchrun

pytest.importorskip("accelerate", reason="HF Accelerate is not installed (pip install 'gpufeed[accelerate]')")

SCRIPT = Path(__file__).with_name("_accelerate_script.py")
IMAGES = 14


def _run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = ImageFolders(tmp_path_factory)(num_classes=2, per_class=IMAGES // 2, size=(40, 48), seed=1)
    ckpt = tmp_path_factory.mktemp("accelerate-ckpt")
    report = result(torchrun(SCRIPT, str(root), str(ckpt)))
    assert [r["world"] for r in report] == [2, 2]
    return report


SIDE_BY_SIDE = {"accelerate": (9.2, _run)}  # see tests/conftest.py


@pytest.fixture(scope="module")
def ranks(side_by_side) -> list[dict[str, Any]]:
    return run_result(side_by_side, "accelerate")


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_training_batches_come_from_gpufeed_workers_disjoint_and_complete(ranks):
    for r in ranks:
        t = r["train"]
        assert t["type"] == "AcceleratedFastLoader" and t["is_fastloader"]
        assert t["registered"] and t["prepare_again_same"]  # accelerator.prepare() keeps it
        assert t["len"] == 4 and t["stats_batches"] == 8 and t["iteration"] == 2
        for epoch in ("epoch0", "epoch1"):
            # every sample was made in one of this loader's gpufeed worker processes
            assert t[epoch]["pids"] and set(t[epoch]["pids"]) <= set(t[epoch]["worker_pids"])
            assert t["main_pid"] not in t[epoch]["pids"]
    for epoch in ("epoch0", "epoch1"):
        seen = [r["train"][epoch]["seen"] for r in ranks]
        assert len(seen[0]) == len(seen[1]) == 16
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(32))
    assert ranks[0]["train"]["epoch0"]["seen"] != ranks[0]["train"]["epoch1"]["seen"]  # a new order each epoch


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_gather_for_metrics_drops_the_padding_of_the_last_step(ranks):
    for r in ranks:
        e = r["eval"]
        assert e["gathered"] == list(range(23))  # 24 gathered in 3 steps, the padded duplicate dropped
        assert e["ends"] == [False, False, True] and e["remainder"] == 23 % 8 and e["len"] == 3


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_accumulate_syncs_at_the_end_of_the_loader(ranks):
    assert [r["accumulate"] for r in ranks] == [[False, False, True, True]] * 2


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_a_distributed_sampler_is_kept_not_sharded_twice(ranks):
    seen = [r["own_sampler"]["seen"] for r in ranks]
    assert all(r["own_sampler"]["sharded_by"] == "sampler" for r in ranks)
    assert [len(s) for s in seen] == [12, 11]
    assert sorted(seen[0] + seen[1]) == list(range(23))


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_split_batches_cuts_each_global_batch_between_the_ranks(ranks):
    for rank, r in enumerate(ranks):
        assert r["split"]["total_batch_size"] == 8
        assert r["split"]["batches"] == [list(range(b * 8 + rank * 4, b * 8 + rank * 4 + 4)) for b in range(4)]


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_an_iterable_dataset_is_sharded_by_accelerate(ranks):
    seen = [r["iterable"]["seen"] for r in ranks]
    assert all(r["iterable"]["dataset"] == "IterableDatasetShard" for r in ranks)
    assert seen == [[0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19], [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 0, 1]]


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_image_path_options_survive_and_plain_prepare_warns(ranks):
    for r in ranks:
        im = r["image"]
        assert im["shapes"] == [[3, 32, 32]] and im["dtypes"] == ["torch.float32"]
        assert im["min"] < 0  # normalized, not uint8 pixels
        assert im["images"] == 8  # decoded by gpufeed's image path (7 samples + 1 padding per rank)
        assert im["plain_type"] == "DataLoaderShard"
        prepare_warning, skip_warning = im["warnings"]
        assert "gpufeed.integrations.accelerate.prepare(accelerator, loader)" in prepare_warning
        assert "gpufeed.integrations.accelerate.skip_first_batches(loader, n)" in skip_warning
        assert set(im["warning_files"]) == {"_accelerate_script.py"}  # points at the user's line


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_prepared_loaders_share_the_host_cache(ranks):
    caches = [r["host_cache"] for r in ranks]
    for c in caches:
        assert c["type"] == "AcceleratedFastLoader" and c["shared"] == 1
        assert c["hit_rates"][0] < 0.5 and c["hit_rates"][1] == 1.0
    # epoch 2 served, from the one cache, images that only the other rank read in epoch 1
    first = [set(c["seen"][0]) for c in caches]
    assert any(set(c["seen"][1]) - mine for c, mine in zip(caches, first, strict=True))
    assert first[0] | first[1] == set(caches[0]["seen"][1]) | set(caches[1]["seen"][1])


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_save_state_load_state_resume_mid_epoch(ranks):
    for r in ranks:
        s = r["resume"]
        assert s["stateful"] and "dl_state_dict.bin" in s["files"]
        assert len(s["head"]) == 3 and len(s["rest"]) == 2
        assert s["resumed"] == s["rest"]  # the rest of the epoch, exactly
        assert s["iteration_after"] == 2
        assert s["skipped_len"] == s["skipped_batches"] == s["full_len"] - 2
        assert s["state"]["accelerate"] == {"num_processes": 2, "sharded_by": "accelerate", "iteration": 1}
        assert s["state"]["batches_yielded"] == 3 and s["state"]["sampler"]["kind"] == "random"
        world, not_fast, replicas = s["errors"]
        assert world.startswith("ValueError: the state was taken on 3 process(es)")
        assert not_fast.startswith("TypeError: `loader` must be a gpufeed FastLoader. Found: DataLoader")
        assert replicas.startswith("ValueError: the loader's DistributedSampler shards over num_replicas=3")
    heads = [i for r in ranks for b in r["resume"]["head"] + r["resume"]["rest"] for i in b]
    assert sorted(heads) == list(range(40))


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_image_path_resumes_byte_identical_with_another_num_workers(ranks):
    for r in ranks:
        assert r["image_resume"] == {"rest": 2, "equal": True}
