"""The loader state Lightning checkpoints, in-process: torch's DistributedSampler (the
one Lightning injects) and a state taken after a pass's last batch, which must carry the next
pass's order (Lightning iter()s a resumed loader before it calls set_epoch)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

from gpufeed import FastLoader

from ._datasets import IndexDataset

pytestmark = pytest.mark.timeout(60)

N = 22


def ranked(rank: int, num_workers: int, replicas: int = 2, epoch: int = 1) -> FastLoader:
    sampler = TorchDistributedSampler(IndexDataset(N), num_replicas=replicas, rank=rank, shuffle=True, seed=4)
    sampler.set_epoch(epoch)
    return FastLoader(IndexDataset(N), batch_size=3, sampler=sampler, num_workers=num_workers)


def indices(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b[0]]  # IndexDataset: (indices, tensors)


def through_json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2)])
def test_torch_distributed_sampler_state_of_rank_0_resumes_every_rank(before: int, after: int) -> None:
    full = {r: indices(ranked(r, 0)) for r in (0, 1)}
    loader = ranked(0, before)
    it = iter(loader)
    head = [next(it), next(it)]
    state = through_json(loader.state_dict())
    del it
    assert state["sampler"] == {"kind": "torch_distributed", "epoch": 1, "seed": 4, "shuffle": True,
                                "drop_last": False, "num_replicas": 2, "dataset_len": N}
    assert indices(head) == full[0][:6]
    for rank in (0, 1):  # a framework checkpoints rank 0's state; every rank loads it
        resumed = ranked(rank, after, epoch=0)  # a fresh process: the sampler's epoch is not set yet
        resumed.load_state_dict(state)
        assert indices(resumed) == full[rank][6:]


def test_torch_distributed_sampler_state_refuses_another_world_size() -> None:
    loader = ranked(0, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = ranked(0, 0, replicas=3)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="num_replicas.*gpufeed.DistributedSampler can"):
        list(other)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_after_the_last_batch_starts_the_next_epoch_with_its_order(num_workers: int) -> None:
    def make() -> FastLoader:
        return FastLoader(IndexDataset(N), batch_size=4, shuffle=True, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(9))

    loader = make()
    epoch0 = []
    for batch in loader:
        epoch0.append(batch)
        state = through_json(loader.state_dict())  # the last one: after the epoch's last batch
    epoch1 = indices(loader)
    assert state["sampler"] is None and state["batches_yielded"] == 0
    assert state["next_sampler"]["kind"] == "random"
    resumed = make()
    resumed.load_state_dict(state)
    assert indices(resumed) == epoch1  # not epoch 0's order again, and not an empty epoch


def test_torch_distributed_state_between_epochs_sets_the_next_epoch() -> None:
    loader = ranked(1, 0, epoch=2)
    full = indices(loader)
    state = through_json(loader.state_dict())
    assert state["next_sampler"] == {"kind": "torch_distributed", "epoch": 3}
    nxt = ranked(1, 0, epoch=3)
    resumed = ranked(1, 0, epoch=0)
    resumed.load_state_dict(state)
    assert resumed.sampler.epoch == 3 and indices(resumed) == indices(nxt) != full


def test_persistent_workers_state_mid_second_epoch_resumes_exactly() -> None:
    """Lightning's usual set-up: persistent workers, set_epoch before each epoch, a checkpoint
    mid-epoch 1 (the iterator of epoch 0 is reused)."""

    def make(epoch: int) -> FastLoader:
        sampler = TorchDistributedSampler(IndexDataset(N), num_replicas=2, rank=1, shuffle=True, seed=4)
        sampler.set_epoch(epoch)
        return FastLoader(IndexDataset(N), batch_size=3, sampler=sampler, num_workers=2, persistent_workers=True)

    loader = make(0)
    epoch0 = indices(loader)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it), next(it)]
    state = through_json(loader.state_dict())
    rest = indices(it)
    loader.close()
    assert state["sampler"]["epoch"] == 1 and state["batches_yielded"] == 2
    resumed = make(0)
    resumed.load_state_dict(state)
    assert indices(resumed) == rest and indices(head) + rest != epoch0
    resumed.close()
