"""torchdata's own samplers in a FastLoader: the samplers written for torchdata's
StatefulDataLoader resume mid-epoch as they do there. Skipped without torchdata (a dev extra)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpufeed import FastLoader

from ._datasets import IndexDataset
from .test_resume import indices_of, interrupted, same

sampler_module = pytest.importorskip("torchdata.stateful_dataloader.sampler", reason="torchdata is not installed")

pytestmark = pytest.mark.timeout(90)

N = 22


def distributed(rank: int, num_workers: int) -> FastLoader:
    sampler = sampler_module.StatefulDistributedSampler(IndexDataset(N), num_replicas=2, rank=rank, shuffle=True,
                                                        seed=4)
    return FastLoader(IndexDataset(N), batch_size=3, sampler=sampler, num_workers=num_workers)


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_stateful_distributed_sampler_resumes_each_rank_in_a_later_epoch(before: int, after: int) -> None:
    """Its state is the count of indices it yielded this pass, stale until the next pass starts:
    the state gpufeed keeps is the one after the received batches, as StatefulDataLoader's."""
    for rank in (0, 1):
        loader = distributed(rank, before)
        list(loader)
        loader.set_epoch(1)
        full = list(loader)
        loader = distributed(rank, before)
        list(loader)
        loader.set_epoch(1)
        head, state = interrupted(loader, 2)
        assert state["sampler"]["kind"] == "stateful" and state["sampler"]["epoch"] == 1
        assert state["sampler"]["state"] == {"yielded": 6}
        resumed = distributed(rank, after)  # a new process: epoch 0 until the state says otherwise
        resumed.load_state_dict(state)
        assert same(head + list(resumed), full)
        assert len(list(resumed)) == len(full)  # the state applied to one pass


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_torchdata_random_and_batch_sampler(before: int, after: int) -> None:
    """torchdata's RandomSampler keeps its state in its iterator, not in itself: gpufeed redraws
    the pass from the generator state it started from, inside torchdata's BatchSampler."""

    def make(num_workers: int) -> FastLoader:
        sampler = sampler_module.RandomSampler(IndexDataset(N), generator=torch.Generator().manual_seed(2))
        batches = sampler_module.BatchSampler(sampler, 4, False)
        return FastLoader(IndexDataset(N), batch_sampler=batches, num_workers=num_workers)

    loader = make(before)
    list(loader)
    full = list(loader)
    loader = make(before)
    list(loader)
    head, state = interrupted(loader, 3)
    assert state["sampler"]["kind"] == "custom" and "generator_state" in state["sampler"]
    resumed = make(after)
    resumed.load_state_dict(state)
    rest: list[Any] = list(resumed)
    assert same(head + rest, full)
    assert sorted(i for b in indices_of(head + rest) for i in b) == list(range(N))
