"""Mid-epoch state: a resumed run yields exactly the batches of the uninterrupted one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from gpufeed import DistributedSampler, FastLoader, ImageFolder, RandomResizedCrop

from ._datasets import IndexDataset

pytestmark = pytest.mark.timeout(60)

N = 23
BATCH = 4  # 6 batches, the last of 3


def flat(batches: list[Any]) -> list[torch.Tensor]:
    out = []
    for b in batches:
        out.extend(b if isinstance(b, (list, tuple)) else [b])
    return out


def same(a: list[Any], b: list[Any]) -> bool:
    fa, fb = flat(a), flat(b)
    return len(a) == len(b) and len(fa) == len(fb) and all(torch.equal(x, y) for x, y in zip(fa, fb))


def generic(num_workers: int, **kw: Any) -> FastLoader:
    kw.setdefault("generator", torch.Generator().manual_seed(3))
    return FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True, num_workers=num_workers, **kw)


@pytest.fixture(scope="module")
def image_root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=9, size=(120, 150), seed=4)


def image(root: Path, num_workers: int) -> FastLoader:
    return FastLoader(ImageFolder(root, transform=RandomResizedCrop(48)), batch_size=4, shuffle=True,
                      num_workers=num_workers, seed=7, generator=torch.Generator().manual_seed(5))


def interrupted(loader: FastLoader, k: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` batches of an epoch and the state after them (through JSON)."""
    head = []
    for i, batch in enumerate(loader):
        head.append(batch)
        if i + 1 == k:
            state = loader.state_dict()
            break
    return head, json.loads(json.dumps(state))


@pytest.mark.parametrize(("before", "after"), [(0, 0), (2, 2), (2, 0), (0, 2)])
@pytest.mark.parametrize("k", [1, 3])
def test_generic_resume_is_exact(before: int, after: int, k: int) -> None:
    full = list(generic(before))
    head, state = interrupted(generic(before), k)
    assert state["batches_yielded"] == k and state["samples_yielded"] == k * BATCH
    assert same(head, full[:k])
    resumed = generic(after)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[k:])
    # the state applied to one iter(): the next pass is a whole epoch again
    assert len(list(resumed)) == len(full)


def test_global_rng_random_sampler_resumes() -> None:
    """RandomSampler without a generator draws its seed from torch's global RNG."""
    torch.manual_seed(0)
    full = list(FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True))
    torch.manual_seed(0)
    loader = FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True)
    head, state = interrupted(loader, 2)
    assert same(head, full[:2])
    torch.manual_seed(123)  # another process: another global RNG
    resumed = FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True, num_workers=2)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[2:])


def test_sequential_and_second_epoch() -> None:
    loader = FastLoader(IndexDataset(N), batch_size=BATCH)
    list(loader)
    assert loader.state_dict()["batches_yielded"] == 0  # the epoch ended: the next starts afresh
    head, state = interrupted(loader, 4)
    resumed = FastLoader(IndexDataset(N), batch_size=BATCH, num_workers=2)
    resumed.load_state_dict(state)
    assert same(head + list(resumed), list(FastLoader(IndexDataset(N), batch_size=BATCH)))


@pytest.mark.parametrize(("before", "after"), [(0, 0), (2, 2), (2, 0), (0, 2)])
@pytest.mark.parametrize("k", [1, 2])
def test_image_resume_is_byte_identical(image_root: Path, before: int, after: int, k: int) -> None:
    loader = image(image_root, before)
    list(loader)  # epoch 0; the state is taken in epoch 1
    full = list(loader)
    loader = image(image_root, before)
    list(loader)
    head, state = interrupted(loader, k)
    assert state["epoch"] == 1
    assert same(head, full[:k])
    resumed = image(image_root, after)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[k:])


def test_unknown_version_and_mid_epoch_load_are_clear_errors() -> None:
    loader = generic(0)
    state = loader.state_dict()
    assert state["version"] == 2 and state["sampler"] is None
    with pytest.raises(ValueError, match="version 99 is not supported"):
        loader.load_state_dict({**state, "version": 99})
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="partway through an epoch"):
        loader.load_state_dict(loader.state_dict())
    del it
    loader.load_state_dict(state)  # no iterator alive: fine


class GatedDataset(IndexDataset):
    """Samples of ``held`` wait until ``gate`` (a file) exists: the batch holding them completes
    only when the test says, so with in_order=False the batches after it go out first."""

    def __init__(self, n: int, held: set[int], gate: Path) -> None:
        super().__init__(n)
        self.held, self.gate = held, gate

    def __getitem__(self, i: int) -> Any:
        if i in self.held:
            deadline = time.monotonic() + 60
            while not self.gate.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().__getitem__(i)


def indices_of(batches: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in b[0]) for b in batches]


@pytest.mark.parametrize(("after", "after_in_order"), [(2, False), (0, True), (2, True)])
def test_out_of_order_state_lists_the_batches_delivered_past_the_gap(tmp_path: Path, after: int,
                                                                     after_in_order: bool) -> None:
    """in_order=False: batch 1 is held back while batch 0 and two later ones go out; the state says
    "1 batch, then these past the gap", and the resumed pass yields exactly the batches not received."""
    gate = tmp_path / "open"
    held = set(range(BATCH, 2 * BATCH))  # batch 1 (sequential sampler)
    loader = FastLoader(GatedDataset(N, held, gate), batch_size=BATCH, num_workers=2, in_order=False)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 3:
            state = json.loads(json.dumps(loader.state_dict()))
            gate.touch()
            break
    numbers = [b[0][0].item() // BATCH for b in head]  # which batches of the epoch went out
    assert 0 in numbers and 1 not in numbers  # batch 1 is held back; 0 is not
    assert state["batches_yielded"] == 1 and state["samples_yielded"] == BATCH
    assert state["delivered_beyond"] == sorted(n - 1 for n in numbers if n > 1)
    resumed = FastLoader(IndexDataset(N), batch_size=BATCH, num_workers=after, in_order=after_in_order)
    resumed.load_state_dict(state)
    rest = list(resumed)
    full = indices_of(list(FastLoader(IndexDataset(N), batch_size=BATCH)))
    assert sorted(indices_of(head) + indices_of(rest)) == sorted(full)  # each batch exactly once
    assert len(list(resumed)) == len(full)  # the next pass is a whole epoch again


def test_out_of_order_state_taken_again_after_a_resume(tmp_path: Path) -> None:
    """A resumed out-of-order pass checkpointed again: its state combines the skipped batches
    with the ones received since, and a second resume completes the epoch exactly once."""
    gen = torch.Generator().manual_seed(8)
    order = indices_of(list(FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True,
                                       generator=torch.Generator().manual_seed(8))))
    gate = tmp_path / "open"
    loader = FastLoader(GatedDataset(N, set(order[0]), gate), batch_size=BATCH, shuffle=True, generator=gen,
                        num_workers=2, in_order=False)
    first: list[Any] = []
    for batch in loader:
        first.append(batch)
        if len(first) == 2:
            state = loader.state_dict()
            gate.touch()
            break
    assert state["batches_yielded"] == 0 and len(state["delivered_beyond"]) == 2
    second_loader = FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True,
                               generator=torch.Generator().manual_seed(99), num_workers=2, in_order=False)
    second_loader.load_state_dict(state)
    second: list[Any] = []
    for batch in second_loader:
        second.append(batch)
        if len(second) == 2:
            state2 = json.loads(json.dumps(second_loader.state_dict()))
            break
    third_loader = FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True, num_workers=0)
    third_loader.load_state_dict(state2)
    third = list(third_loader)
    got = indices_of(first) + indices_of(second) + indices_of(third)
    assert sorted(got) == sorted(order)  # the generator's epoch, each batch exactly once


@pytest.mark.parametrize("k", [1, 2])
def test_distributed_world_size_change(k: int) -> None:
    dataset = IndexDataset(N)

    def ids(batches: list[Any]) -> list[int]:
        return [int(i) for b in batches for i in b[0]]

    ranks = [FastLoader(dataset, batch_size=2, num_workers=w,
                        sampler=DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=True, seed=9,
                                                   mode="eval"))
             for r, w in ((0, 0), (1, 2))]
    for loader in ranks:
        loader.set_epoch(1)
    seen: list[int] = []
    states = []
    for loader in ranks:
        head, state = interrupted(loader, k)
        seen += ids(head)
        states.append(state)
    assert states[0]["sampler"] == states[1]["sampler"]  # a position valid on any world size
    single = FastLoader(dataset, batch_size=2,
                        sampler=DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=9,
                                                   mode="eval"))
    single.load_state_dict(states[0])
    single.set_epoch(1)  # the state's epoch: keeps its position
    rest = ids(list(single))
    assert sorted(seen + rest) == list(range(N))


class Counter(IterableDataset):
    def __init__(self) -> None:
        self.start = 0
        self.pos = 0

    def __iter__(self):
        for pos in range(self.start, 10):
            self.pos = pos
            yield pos

    def state_dict(self) -> dict[str, int]:
        return {"start": self.pos + 1}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["start"]


def test_iterable_dataset_delegates_or_refuses() -> None:
    loader = FastLoader(Counter(), batch_size=None)
    head, state = interrupted(loader, 3)
    resumed = FastLoader(Counter(), batch_size=None)
    resumed.load_state_dict(state)
    assert [int(x) for x in head + list(resumed)] == list(range(10))

    class Plain(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(NotImplementedError, match="has no state_dict"):
        FastLoader(Plain()).state_dict()


def test_custom_sampler_inside_accelerates_shard_is_a_clear_error() -> None:
    """A sampler of the user's resumes (tests/integration/test_resume_custom.py), except inside
    another sharding sampler, here Accelerate's BatchSamplerShard."""
    data_loader = pytest.importorskip("accelerate.data_loader", reason="accelerate is not installed")

    class Backwards(torch.utils.data.Sampler):
        def __init__(self, n: int) -> None:
            self.n = n

        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))

        def __len__(self) -> int:
            return self.n

    shard = data_loader.BatchSamplerShard(torch.utils.data.BatchSampler(Backwards(N), BATCH, False),
                                          num_processes=2, process_index=0)
    loader = FastLoader(IndexDataset(N), batch_sampler=shard)
    it = iter(loader)
    next(it)
    with pytest.raises(NotImplementedError, match="SequentialSampler, RandomSampler.*BatchSamplerShard over Backwards"):
        loader.state_dict()


def _drawing_sampler(kind: str, generator: torch.Generator | None) -> torch.utils.data.Sampler:
    if kind == "weighted":
        weights = torch.linspace(0.1, 1.0, N)
        return torch.utils.data.WeightedRandomSampler(weights, num_samples=N, generator=generator)
    return torch.utils.data.SubsetRandomSampler(list(range(0, N, 2)) + [1, 3], generator=generator)


@pytest.mark.parametrize("kind", ["weighted", "subset"])
@pytest.mark.parametrize("seeded", [True, False])
@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_weighted_and_subset_samplers_resume(kind: str, seeded: bool, before: int, after: int) -> None:
    """Their order is one draw from their generator, or from torch's global RNG without one (the
    sampler a Lightning user with class imbalance passes): the state holds that generator's state."""

    def make(num_workers: int) -> FastLoader:
        gen = torch.Generator().manual_seed(11) if seeded else None
        return FastLoader(IndexDataset(N), batch_size=BATCH, sampler=_drawing_sampler(kind, gen),
                          num_workers=num_workers)

    torch.manual_seed(1)
    full = list(make(before))
    torch.manual_seed(1)
    head, state = interrupted(make(before), 2)
    assert state["sampler"]["kind"] == ("weighted_random" if kind == "weighted" else "subset_random")
    assert same(head, full[:2])
    torch.manual_seed(99)  # the resumed process's global RNG is another: the state alone decides
    resumed = make(after)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[2:])
