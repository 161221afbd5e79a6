"""gpufeed.DistributedSampler in one process, ranks simulated with explicit num_replicas/rank."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from gpufeed import DistributedSampler

SIZES = [1, 2, 7, 10, 16, 33]
WORLDS = [1, 2, 3, 4, 8]


class Numbers(torch.utils.data.Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def draws(n: int, world: int, **kwargs: object) -> list[list[int]]:
    """What each rank of ``world`` draws for one iteration."""
    return [list(DistributedSampler(Numbers(n), num_replicas=world, rank=r, **kwargs)) for r in range(world)]  # type: ignore[arg-type]


def interleave(per_rank: list[list[int]]) -> list[int]:
    """Ranks' draws back in global order: step by step, rank 0 first."""
    return [i for step in itertools.zip_longest(*per_rank) for i in step if i is not None]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_train_mode_gives_torchs_indices_and_len(n, world, shuffle, drop_last):
    for rank in range(world):
        kwargs = dict(num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        ours, theirs = DistributedSampler(Numbers(n), **kwargs), TorchSampler(Numbers(n), **kwargs)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs) == ours.num_samples == theirs.num_samples
            assert ours.total_size == theirs.total_size


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world", WORLDS)
def test_train_mode_gives_every_rank_the_same_count(n, world):
    for drop_last in (False, True):
        per_rank = draws(n, world, drop_last=drop_last)
        assert len({len(d) for d in per_rank}) == 1
        if not drop_last:  # everything seen, only the padding repeats
            assert set(itertools.chain(*per_rank)) == set(range(n))


@pytest.mark.parametrize("n", [0, *SIZES])
@pytest.mark.parametrize("world", WORLDS)
def test_eval_mode_sees_every_sample_exactly_once(n, world):
    per_rank = draws(n, world, mode="eval", seed=3)
    flat = list(itertools.chain(*per_rank))
    assert sorted(flat) == list(range(n))  # disjoint and complete: no padded duplicates
    counts = [len(d) for d in per_rank]
    assert max(counts) - min(counts) <= 1
    for rank in range(world):
        sampler = DistributedSampler(Numbers(n), num_replicas=world, rank=rank, mode="eval", seed=3)
        assert len(sampler) == counts[rank]
        assert sampler.max_num_samples == max(counts, default=0)


def test_same_seed_and_epoch_same_order_other_epochs_and_seeds_differ():
    def order(seed: int, epoch: int) -> list[int]:
        sampler = DistributedSampler(Numbers(100), num_replicas=2, rank=1, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0, 4) == order(0, 4)
    assert order(0, 4) != order(0, 5)
    assert order(1, 4) != order(0, 4) != order(0, 0)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_global_order_does_not_depend_on_the_world_size(mode):
    n = 40  # divisible by every world size here, so train mode pads nothing
    orders = {world: interleave(draws(n, world, mode=mode, seed=9)) for world in (1, 2, 4, 5, 8)}
    assert len(set(map(tuple, orders.values()))) == 1
    reference = DistributedSampler(Numbers(n), num_replicas=1, rank=0, seed=9)
    assert (
        orders[1] == reference.global_order() == torch.randperm(n, generator=torch.Generator().manual_seed(9)).tolist()
    )


@pytest.mark.parametrize("n", [10, 37, 64])
@pytest.mark.parametrize(("world_before", "world_after"), [(2, 3), (4, 1), (3, 8), (1, 2), (5, 5)])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_resume_on_another_world_size_loses_and_repeats_nothing(n, world_before, world_after, mode):
    dataset = Numbers(n)
    before = [
        DistributedSampler(dataset, num_replicas=world_before, rank=r, seed=2, mode=mode) for r in range(world_before)
    ]
    for sampler in before:
        sampler.set_epoch(3)
    steps = min(len(s) for s in before) // 2  # every rank takes `steps` samples, then the job stops
    seen = [list(itertools.islice(iter(s), steps)) for s in before]
    state = before[0].state_dict(samples_per_rank=steps)
    assert state == before[-1].state_dict(samples_per_rank=steps)  # one state, whichever rank saves it
    assert state["position"] == world_before * steps

    after = [
        DistributedSampler(dataset, num_replicas=world_after, rank=r, seed=2, mode=mode) for r in range(world_after)
    ]
    for sampler in after:
        sampler.load_state_dict(state)
        sampler.set_epoch(3)  # the training loop sets the epoch it resumes: keeps the position
    rest = [list(s) for s in after]

    order = before[0].global_order()
    assert interleave(seen) == order[: state["position"]]
    if mode == "eval":
        assert interleave(rest) == order[state["position"] :]
        assert sorted(interleave(seen) + interleave(rest)) == list(range(n))
        assert [len(s) for s in after] == [len(r) for r in rest]
    else:  # same count per rank; beyond the epoch's samples, only the last step's padding
        assert len({len(r) for r in rest}) == 1 == len({len(s) for s in after})
        remaining = n - state["position"]
        assert interleave(rest)[:remaining] == order[state["position"] :]

    for sampler in after:  # the next epoch starts at its beginning
        sampler.set_epoch(4)
    fresh = [
        DistributedSampler(dataset, num_replicas=world_after, rank=r, seed=2, mode=mode) for r in range(world_after)
    ]
    for sampler in fresh:
        sampler.set_epoch(4)
    assert [list(s) for s in after] == [list(s) for s in fresh]


def test_state_dict_counts_the_indices_handed_out_by_default():
    sampler = DistributedSampler(Numbers(20), num_replicas=4, rank=2, seed=1)
    it = iter(sampler)
    for _ in range(3):
        next(it)
    assert sampler.state_dict()["position"] == 12
    assert sampler.state_dict(samples_per_rank=100)["position"] == 20  # capped at len(dataset)


def test_load_state_dict_refuses_another_order():
    state = DistributedSampler(Numbers(20), num_replicas=2, rank=0, seed=1).state_dict(samples_per_rank=2)
    with pytest.raises(ValueError, match=r"`seed` must match .*\(7\).*Found: 1\."):
        DistributedSampler(Numbers(20), num_replicas=3, rank=0, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match=r"`dataset_len` must match .*\(21\).*Found: 20\."):
        DistributedSampler(Numbers(21), num_replicas=3, rank=0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"`position` must be <= len\(dataset\) = 20\. Found: 21\."):
        DistributedSampler(Numbers(20), num_replicas=3, rank=0, seed=1).load_state_dict({**state, "position": 21})


def test_bad_arguments_fail_at_construction_with_the_value_and_the_fix():
    data = Numbers(4)
    with pytest.raises(ValueError, match=r"`rank` must be in \[0, num_replicas - 1\] = \[0, 1\]\. Found: 2\."):
        DistributedSampler(data, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match=r"`rank` must be >= 0\. Found: -1\."):
        DistributedSampler(data, num_replicas=2, rank=-1)
    with pytest.raises(ValueError, match=r"`num_replicas` must be >= 1\. Found: 0\."):
        DistributedSampler(data, num_replicas=0, rank=0)
    with pytest.raises(TypeError, match=r"`seed` must be an int\. Found: 1\.5"):
        DistributedSampler(data, num_replicas=1, rank=0, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r'`mode` must be "train" or "eval"\. Found: \'test\'\.'):
        DistributedSampler(data, num_replicas=1, rank=0, mode="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"drop_last=True with mode=\"eval\"\. Pass drop_last=False"):
        DistributedSampler(data, num_replicas=1, rank=0, drop_last=True, mode="eval")
    with pytest.raises(TypeError, match=r"map-style dataset with len\(\).*Found: Stream\."):

        class Stream(torch.utils.data.IterableDataset[int]):
            def __iter__(self):
                return iter(range(3))

        DistributedSampler(Stream(), num_replicas=1, rank=0)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
def test_without_a_process_group_world_size_and_rank_must_be_given():
    assert not torch.distributed.is_initialized()
    with pytest.raises(
        ValueError,
        match=r"`num_replicas` was not given .*init_process_group\(\) first .* pass num_replicas= and rank=",
    ):
        DistributedSampler(Numbers(4))
    with pytest.raises(ValueError, match=r"`rank` was not given"):
        DistributedSampler(Numbers(4), num_replicas=2)


def test_is_a_torch_distributed_sampler_for_frameworks():
    assert isinstance(DistributedSampler(Numbers(4), num_replicas=1, rank=0), TorchSampler)
