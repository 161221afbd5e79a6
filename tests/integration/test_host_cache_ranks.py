"""The host cache shared by the ranks of a job, under torchrun with 2 CPU ranks
(docs/design/host-cache.md): every rank hits from epoch 2, and every rank reports one budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.synth import make_image_folder

from ._torchrun import result, torchrun

pytestmark = [pytest.mark.timeout(180)]


def test_every_rank_hits_the_rows_any_rank_decoded_from_epoch_two(tmp_path):
    root = tmp_path / "images"
    make_image_folder(root, num_classes=2, per_class=24, size=((40, 60), (40, 60)), seed=0)
    ranks = result(torchrun(Path(__file__).with_name("_host_cache_script.py"), str(root)))
    assert len(ranks) == 2
    for rank in ranks:
        assert rank["shared"] == 1 and rank["same"]  # served rows equal an uncached loader's
        assert rank["hit_rates"][1] >= 0.99 and rank["hit_rates"][2] >= 0.99
    assert ranks[0]["budget"] == ranks[1]["budget"] > 0  # "60%" resolved once for the host
    assert ranks[0]["bytes"] == ranks[1]["bytes"] >= 48 * 32 * 32 * 3  # one copy of the rows


def _spawned_rank(rank: int, port: int, queue) -> None:
    import os

    import torch.distributed as dist

    from gpufeed.cache._job import job_info

    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GPUFEED_CACHE_JOB"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    info = job_info()
    queue.put((info.key, info.source))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_mp_spawn_ranks_with_a_tcp_process_group_agree_on_a_job_key():
    import multiprocessing as mp

    from ._torchrun import _free_port

    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_spawned_rank, args=(rank, port, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    found = [queue.get(timeout=90) for _ in procs]
    for proc in procs:
        proc.join(30)
    assert [proc.exitcode for proc in procs] == [0, 0]
    (key_a, source_a), (key_b, source_b) = found
    assert key_a == key_b and key_a.startswith("store:") and source_a == source_b == "torch.distributed store"
