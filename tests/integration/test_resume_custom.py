"""Mid-epoch state with samplers of the user's: a sampler or batch_sampler with
torchdata's state_dict()/load_state_dict(), or one whose order is redrawn from the random state
its pass started from. The checkpointed batches plus the resumed pass equal the uninterrupted
epoch: no sample lost or repeated, nothing fetched twice."""

from __future__ import annotations

import json
import random
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop

from ._custom_samplers import (
    Backwards,
    EpochCursor,
    GlobalShuffle,
    OwnGeneratorShuffle,
    PrivateDraws,
    StatefulVariableBatches,
    Unseeded,
    VariableBatches,
)
from ._datasets import IndexDataset
from .test_resume import GatedDataset, image_root, indices_of, interrupted, same  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(90)

N = 23
BATCH = 4
WORKERS = [(0, 2), (2, 0)]  # (before, after): each count on each side, and a change of count


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def sampler_loader(make_sampler: Callable[[], Any]) -> Callable[[int], FastLoader]:
    def make(num_workers: int) -> FastLoader:
        return FastLoader(IndexDataset(N), batch_size=BATCH, sampler=make_sampler(), num_workers=num_workers)
    return make


def batch_loader(make_batches: Callable[[], Any]) -> Callable[[int], FastLoader]:
    def make(num_workers: int) -> FastLoader:
        return FastLoader(IndexDataset(N), batch_sampler=make_batches(), num_workers=num_workers)
    return make


def second_epoch(loader: FastLoader) -> FastLoader:
    list(loader)  # epoch 0: the state is taken in epoch 1, whose order depends on what epoch 0 drew
    loader.set_epoch(1)
    return loader


def resumes_exactly(make: Callable[[int], FastLoader], before: int, after: int, k: int) -> dict[str, Any]:
    """Uninterrupted epoch 1 == its first k batches + a fresh loader resumed from the state after
    them (the global RNGs seeded alike before both runs, differently before the resume)."""
    seed_all(0)
    full = list(second_epoch(make(before)))
    seed_all(0)
    head, state = interrupted(second_epoch(make(before)), k)
    assert state["batches_yielded"] == k
    assert same(head, full[:k])
    seed_all(123)  # another process: other global RNG states; the state alone decides
    resumed = make(after)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert same(head + rest, full)
    return state


@pytest.mark.parametrize(("before", "after"), WORKERS)
def test_sampler_with_its_own_generator(before: int, after: int) -> None:
    state = resumes_exactly(sampler_loader(lambda: OwnGeneratorShuffle(N, seed=5)), before, after, k=2)
    sampler = state["sampler"]
    assert sampler["kind"] == "custom" and sampler["sampler"] == "OwnGeneratorShuffle"
    assert "generator_state" in sampler and "rng" not in sampler  # drew from its generator only
    assert len(sampler["head"]) == 2 * BATCH  # the received indices, compared on resume
    assert len(json.dumps(state)) < 10_000


@pytest.mark.parametrize("source", ["torch", "random", "numpy"])
@pytest.mark.parametrize(("before", "after"), WORKERS)
def test_sampler_drawing_from_a_global_rng(source: str, before: int, after: int) -> None:
    state = resumes_exactly(sampler_loader(lambda: GlobalShuffle(N, source)), before, after, k=3)
    assert set(state["sampler"]["rng"]) == {source}  # only the RNG it drew from is recorded


def test_resume_leaves_the_processes_global_rngs_as_they_were() -> None:
    """The recorded RNG states are set only while the resumed pass's order is drawn: afterwards
    the process's own torch/random/numpy states go on as without a resume."""
    make = sampler_loader(lambda: GlobalShuffle(N, "random"))
    seed_all(0)
    _, state = interrupted(make(0), 2)
    resumed = make(0)
    resumed.load_state_dict(state)
    seed_all(77)
    list(resumed)
    after_resume = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1])
    seed_all(77)
    list(FastLoader(IndexDataset(N), batch_size=BATCH, sampler=Backwards(N)))  # draws nothing itself
    plain = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1])
    assert torch.equal(after_resume[0], plain[0]) and after_resume[1] == plain[1]
    assert np.array_equal(after_resume[2], plain[2])


@pytest.mark.parametrize(("before", "after"), WORKERS)
def test_deterministic_sampler(before: int, after: int) -> None:
    state = resumes_exactly(sampler_loader(lambda: Backwards(N)), before, after, k=1)
    assert "rng" not in state["sampler"] and "generator_state" not in state["sampler"]


@pytest.mark.parametrize("make_sampler", [lambda: EpochCursor(N, seed=3), lambda: PrivateDraws(N, 21, seed=4)],
                         ids=["epoch_cursor", "private_draws"])
@pytest.mark.parametrize(("before", "after"), WORKERS)
def test_stateful_sampler_resumes_through_its_own_state(make_sampler: Any, before: int, after: int) -> None:
    state = resumes_exactly(sampler_loader(make_sampler), before, after, k=2)
    sampler = state["sampler"]
    assert sampler["kind"] == "stateful"
    # its own state after the 2 received batches (workers pulled further ahead: not that one)
    inner = sampler["state"]
    assert inner.get("yielded", inner.get("pos")) == 2 * BATCH


@pytest.mark.parametrize("cls", [VariableBatches, StatefulVariableBatches])
@pytest.mark.parametrize(("before", "after"), WORKERS)
def test_batch_sampler_with_variable_batches(cls: type, before: int, after: int) -> None:
    state = resumes_exactly(batch_loader(lambda: cls(N, seed=6)), before, after, k=3)
    assert state["samples_yielded"] == 3 + 1 + 4
    assert state["sampler"]["kind"] == ("stateful" if cls is StatefulVariableBatches else "custom")


def test_unreproducible_sampler_is_a_clear_error() -> None:
    make = sampler_loader(lambda: Unseeded(N))
    _, state = interrupted(make(0), 2)
    resumed = make(0)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="resuming Unseeded mid-epoch.*state_dict\\(\\)/load_state_dict\\(\\)"):
        list(resumed)


def test_another_sampler_class_is_refused() -> None:
    _, state = interrupted(sampler_loader(lambda: OwnGeneratorShuffle(N, seed=5))(0), 2)
    other = sampler_loader(lambda: Backwards(N))(0)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="class 'OwnGeneratorShuffle'; this loader's is 'Backwards'"):
        list(other)


def test_stateful_state_taken_before_any_batch_starts_the_pass_afresh() -> None:
    """Workers pull ahead at iter(): a state taken before the first batch is received restarts
    the pass (EpochCursor still reports its previous pass's position then)."""
    make = sampler_loader(lambda: EpochCursor(N, seed=3))
    loader = second_epoch(make(2))
    it = iter(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    full = list(it)
    assert state["batches_yielded"] == 0 and state["sampler"]["state"] is None
    resumed = make(0)
    resumed.load_state_dict(state)
    assert same(list(resumed), full)


def test_custom_generator_state_between_epochs_gives_the_next_epochs_order() -> None:
    make = sampler_loader(lambda: OwnGeneratorShuffle(N, seed=5))
    loader = make(0)
    for _ in loader:
        state = json.loads(json.dumps(loader.state_dict()))  # the last: after the epoch's last batch
    epoch1 = list(loader)
    assert state["sampler"] is None and state["next_sampler"]["kind"] == "custom"
    resumed = make(0)
    resumed.load_state_dict(state)
    assert same(list(resumed), epoch1)


@pytest.mark.parametrize("make_sampler", [lambda: OwnGeneratorShuffle(N, seed=8), lambda: EpochCursor(N, seed=8)],
                         ids=["custom", "stateful"])
def test_out_of_order_custom_sampler_skips_the_batches_delivered_past_the_gap(tmp_path: Path,
                                                                              make_sampler: Any) -> None:
    """in_order=False: the first batch is held back while later ones go out; the state lists
    them and the resumed pass yields exactly the batches not received."""
    order = indices_of(list(FastLoader(IndexDataset(N), batch_size=BATCH, sampler=make_sampler())))
    gate = tmp_path / "open"
    loader = FastLoader(GatedDataset(N, set(order[0]), gate), batch_size=BATCH, sampler=make_sampler(),
                        num_workers=2, in_order=False)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 2:
            state = json.loads(json.dumps(loader.state_dict()))
            gate.touch()
            break
    assert state["batches_yielded"] == 0 and len(state["delivered_beyond"]) == 2
    resumed = FastLoader(IndexDataset(N), batch_size=BATCH, sampler=make_sampler(), num_workers=2)
    resumed.load_state_dict(state)
    assert sorted(indices_of(head) + indices_of(list(resumed))) == sorted(order)


@pytest.mark.parametrize("seeded", [True, False])
def test_lightnings_distributed_sampler_wrapper_resumes_every_rank_from_rank_0s_state(seeded: bool) -> None:
    """Under DDP Lightning wraps a sampler of the user's (here a WeightedRandomSampler, with its
    own generator or drawing from torch's RNG, as seed_everything leaves it alike on every rank)
    in its DistributedSamplerWrapper and checkpoints rank 0's loader state; every rank loads it."""
    distributed = pytest.importorskip("lightning.fabric.utilities.distributed", reason="lightning is not installed")

    def make(rank: int, num_workers: int) -> FastLoader:
        gen = torch.Generator().manual_seed(3) if seeded else None
        inner = torch.utils.data.WeightedRandomSampler(torch.linspace(0.2, 1.0, N), N, generator=gen)
        sampler = distributed.DistributedSamplerWrapper(inner, num_replicas=2, rank=rank, shuffle=True, seed=1)
        return FastLoader(IndexDataset(N), batch_size=3, sampler=sampler, num_workers=num_workers)

    runs = {}
    for rank in (0, 1):
        seed_all(0)  # seed_everything: every rank alike
        full = list(second_epoch(make(rank, 0)))
        seed_all(0)
        head, state = interrupted(second_epoch(make(rank, 2)), 2)
        runs[rank] = (full, head, state)
    state0 = runs[0][2]
    assert state0["sampler"]["kind"] == "custom" and state0["sampler"]["rank"] == 0
    assert state0["sampler"]["epoch"] == 1
    assert ("generator_state" in state0["sampler"]) == seeded and ("rng" in state0["sampler"]) != seeded
    for rank, (full, head, _) in runs.items():
        seed_all(0)  # the restarted job seeds alike again; its RNGs have drawn other numbers since
        torch.rand(5)
        resumed = make(rank, 0)
        resumed.load_state_dict(state0)
        assert same(head + list(resumed), full)


class Tracked(dict):
    """A state that can be counted while alive."""


class TrackedCursor(EpochCursor):
    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, seed)
        self.states: list[weakref.ref[Tracked]] = []

    def state_dict(self) -> dict[str, Any]:
        state = Tracked(super().state_dict())
        self.states.append(weakref.ref(state))
        return state

    def live(self) -> int:
        return sum(ref() is not None for ref in self.states)


def test_stateful_sampler_states_are_kept_only_until_their_batch_is_received() -> None:
    """gpufeed takes the sampler's state after each batch it pulls; once the user has received
    the batch, the states before it are dropped: memory stays flat over a long epoch."""
    sampler = TrackedCursor(240, seed=1)
    loader = FastLoader(IndexDataset(240), batch_size=2, sampler=sampler, num_workers=2, prefetch_factor=2)
    most = 0
    for _ in loader:
        most = max(most, sampler.live())  # a dict without cycles dies with its last reference
    assert most <= 2 * 2 + 3  # the batches in flight, not the 120 of the epoch
    _, state = interrupted(FastLoader(IndexDataset(240), batch_size=2, sampler=TrackedCursor(240, seed=1),
                                      num_workers=2), 50)
    assert state["sampler"]["state"]["yielded"] == 100


def test_a_state_that_is_not_serialisable_is_a_clear_error() -> None:
    class Opaque(EpochCursor):
        def state_dict(self) -> dict[str, Any]:
            return {"yielded": self.yielded, "lock": threading.Lock()}

    loader = FastLoader(IndexDataset(N), batch_size=BATCH, sampler=Opaque(N, seed=1))
    it = iter(loader)
    next(it)
    with pytest.raises(TypeError, match=r"state_dict\(\) of .*Opaque\['lock'\] holds a lock"):
        loader.state_dict()


def test_image_path_with_a_sampler_of_the_users_is_byte_identical(image_root: Path) -> None:  # noqa: F811
    def make(num_workers: int) -> FastLoader:
        dataset = ImageFolder(image_root, transform=RandomResizedCrop(48))
        return FastLoader(dataset, batch_size=4, sampler=OwnGeneratorShuffle(len(dataset), seed=2),
                          num_workers=num_workers, seed=7)

    resumes_exactly(make, before=2, after=0, k=2)


@pytest.mark.parametrize("make_sampler", [lambda: OwnGeneratorShuffle(N, seed=8), lambda: EpochCursor(N, seed=8)],
                         ids=["custom", "stateful"])
def test_persistent_workers_state_mid_second_epoch(make_sampler: Any) -> None:
    """Lightning's usual set-up: persistent workers (the iterator of epoch 0 is reused, and pulls
    the next epoch's first batches before the loop asks), set_epoch before each epoch."""

    def make() -> FastLoader:
        return FastLoader(IndexDataset(N), batch_size=3, sampler=make_sampler(), num_workers=2,
                          persistent_workers=True)

    loader = make()
    list(loader)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it), next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = list(it)
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert same(list(resumed), rest)
    resumed.close()
    assert state["batches_yielded"] == 2 and len(head) == 2
