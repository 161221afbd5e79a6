"""Mid-epoch resume with workers: datasets that draw from the workers' random
generators, and IterableDatasets whose workers each hold a copy of the position."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from gpufeed import FastLoader

from ._batches import same
from ._datasets import IndexDataset, RandomDataset

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:This DataLoader will create")]

N = 23
BATCH = 4  # 6 batches, the last of 3
REPO = Path(__file__).resolve().parents[2]


def drawing(num_workers: int, seed: int = 3, **kw: Any) -> FastLoader:
    """Every sample draws from torch, random and numpy in its worker."""
    return FastLoader(RandomDataset(N), batch_size=BATCH, shuffle=True, num_workers=num_workers,
                      generator=torch.Generator().manual_seed(seed), **kw)


def take(loader: FastLoader, k: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` batches of a pass and the state after them (through JSON)."""
    head = []
    it = iter(loader)
    for _ in range(k):
        head.append(next(it))
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    return head, state


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_worker_rng_resumes_exactly(num_workers: int, k: int) -> None:
    full = list(drawing(num_workers))
    head, state = take(drawing(num_workers), k)
    assert same(head, full[:k])
    workers = state["workers"]
    assert workers["num_workers"] == num_workers and workers["next"] == k % num_workers
    drew = [w % num_workers for w in range(k)]
    assert [r is not None for r in workers["rng"]] == [w in drew for w in range(num_workers)]
    resumed = drawing(num_workers)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert same(rest, full[k:])
    # without the workers' part the remaining samples are the same, their random values are not
    blind = drawing(num_workers)
    blind.load_state_dict({k_: v for k_, v in state.items() if k_ != "workers"})
    assert [b["i"].tolist() for b in list(blind)] == [b["i"].tolist() for b in full[k:]]


def test_second_epoch_with_persistent_workers() -> None:
    uninterrupted = drawing(2, persistent_workers=True)
    epochs = [list(uninterrupted) for _ in range(3)]
    loader = drawing(2, persistent_workers=True)
    assert same(list(loader), epochs[0])
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert same(head, epochs[1][:3])
    assert same(list(it), epochs[1][3:])
    del it
    # into a fresh loader, and into the same one once its pass ended (its persistent workers,
    # seeded alike but further on, restore the states)
    for target in (drawing(2, persistent_workers=True), loader):
        target.load_state_dict(state)
        assert same(list(target), epochs[1][3:])
        assert same(list(target), epochs[2])  # the workers and the generator carry on as uninterrupted


def test_later_epochs_without_persistent_workers() -> None:
    uninterrupted = drawing(2)
    epochs = [list(uninterrupted) for _ in range(3)]
    loader = drawing(2)
    list(loader)
    _, state = take(loader, 2)
    resumed = drawing(2)
    resumed.load_state_dict(state)
    assert same(list(resumed), epochs[1][2:])
    assert same(list(resumed), epochs[2])


def test_persistent_workers_seeded_otherwise_are_restarted() -> None:
    full = list(drawing(2))
    _, state = take(drawing(2), 2)
    other = drawing(2, seed=4, persistent_workers=True)
    list(other)  # its workers are alive, seeded from another base seed
    pids = other.worker_pids()
    other.load_state_dict(state)
    assert same(list(other), full[2:])
    assert not set(pids) & set(other.worker_pids())


def test_state_between_passes_continues_persistent_workers() -> None:
    """The next pass of persistent workers draws no base seed and continues their random states:
    a state taken at an epoch's end carries them (and the order of the next epoch)."""
    uninterrupted = drawing(2, persistent_workers=True)
    epochs = [list(uninterrupted) for _ in range(3)]
    loader = drawing(2, persistent_workers=True)
    list(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["sampler"] is None and state["workers"]["next"] == 0
    resumed = drawing(2, persistent_workers=True)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # loaded, not applied yet
    assert same(list(resumed), epochs[1])
    assert same(list(resumed), epochs[2])


def test_resume_in_a_fresh_process(tmp_path: Path) -> None:
    full = list(drawing(2))
    _, state = take(drawing(2), 3)
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = tmp_path / "rest.pt"
    subprocess.run([sys.executable, str(REPO / "tests/integration/_resume_workers_script.py"),
                    str(tmp_path / "state.json"), str(out), "2"], check=True, timeout=100, cwd=REPO)
    assert same(torch.load(out), full[3:])


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1), (2, 0)])
def test_another_worker_count_loses_and_repeats_nothing(before: int, after: int) -> None:
    full = list(drawing(before))
    head, state = take(drawing(before), 2)
    resumed = drawing(after)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [b["i"].tolist() for b in head + rest] == [b["i"].tolist() for b in full]


def test_in_order_false_loses_and_repeats_nothing() -> None:
    full = list(drawing(2))
    head, state = take(drawing(2, in_order=False), 3)
    resumed = drawing(2, in_order=False)
    resumed.load_state_dict(state)
    seen = sorted(i for b in head + list(resumed) for i in b["i"].tolist())
    assert seen == sorted(i for b in full for i in b["i"].tolist()) == list(range(N))


def test_datasets_that_never_draw_store_no_random_state() -> None:
    loader = FastLoader(IndexDataset(N), batch_size=BATCH, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(3))
    _, state = take(loader, 3)
    assert state["version"] == 2 and state["workers"]["rng"] == [None, None]
    assert len(json.dumps(state["workers"])) < 120


def test_version_1_states_still_load() -> None:
    full = list(drawing(2))
    _, state = take(drawing(2), 2)
    old = {k: v for k, v in state.items() if k != "workers"}
    old["version"] = 1
    resumed = drawing(2)
    resumed.load_state_dict(old)
    assert [b["i"].tolist() for b in resumed] == [b["i"].tolist() for b in full[2:]]


def test_malformed_workers_part_is_a_clear_error() -> None:
    _, state = take(drawing(2), 2)
    state["workers"]["rng"][1] = {"torch": "not base64!"}
    with pytest.raises(ValueError, match=r"\['rng'\]\[1\] is not a random state"):
        drawing(2).load_state_dict(state)


# -- IterableDataset with workers ----------------------------------------------------------------


class ShardedCounter(IterableDataset):
    """Worker ``k`` of ``n`` yields ``(k, j, draws)`` for its ``j`` in ``range(lengths[k])``; its
    ``state_dict()`` is the next ``j``, applied to its next ``iter()`` only."""

    def __init__(self, lengths: tuple[int, ...]) -> None:
        self.lengths = lengths
        self.next_j = 0
        self._resume_j: int | None = None

    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else 0
        start, self._resume_j = self._resume_j or 0, None
        for j in range(start, self.lengths[worker]):
            self.next_j = j + 1
            yield {"worker": worker, "j": j, "py": random.random(), "torch": torch.rand(2),
                   "np": np.random.rand()}

    def state_dict(self) -> dict[str, int]:
        return {"next_j": self.next_j}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_j = self.next_j = int(state["next_j"])


def sharded(lengths: tuple[int, ...], **kw: Any) -> FastLoader:
    return FastLoader(ShardedCounter(lengths), batch_size=2, num_workers=len(lengths),
                      generator=torch.Generator().manual_seed(5), **kw)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_iterable_dataset_resumes_with_workers(k: int) -> None:
    lengths = (4, 11)  # worker 0 ends after its 2nd batch: later batches all come from worker 1
    full = list(sharded(lengths))
    assert [int(b["worker"][0]) for b in full] == [0, 1, 0, 1, 1, 1, 1, 1]
    head, state = take(sharded(lengths), k)
    assert same(head, full[:k])
    workers = state["workers"]
    assert workers["num_workers"] == 2 and len(workers["datasets"]) == 2
    assert workers["exhausted"] == ([0] if k >= 4 else [])
    resumed = sharded(lengths)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[k:])
    assert len(list(resumed)) == len(full)  # the state applied to one pass


def test_iterable_dataset_second_epoch_with_persistent_workers() -> None:
    lengths = (5, 6)
    uninterrupted = sharded(lengths, persistent_workers=True)
    epochs = [list(uninterrupted) for _ in range(2)]
    loader = sharded(lengths, persistent_workers=True)
    list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert same(head + list(it), epochs[1])
    del it
    for target in (sharded(lengths, persistent_workers=True), loader):
        target.load_state_dict(state)
        assert same(list(target), epochs[1][3:])


def test_iterable_dataset_state_needs_the_same_worker_count() -> None:
    _, state = take(sharded((4, 4)), 1)
    with pytest.raises(ValueError, match="num_workers=2"):
        FastLoader(ShardedCounter((4, 4, 4)), batch_size=2, num_workers=3).load_state_dict(state)
    loader = sharded((4, 4))
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="partway through an epoch"):
        loader.load_state_dict(state)
    list(it)
    loader.load_state_dict(state)  # the pass ended: fine


def test_iterable_dataset_without_state_is_a_clear_error() -> None:
    class Plain(IterableDataset):
        def __iter__(self):
            return iter(range(8))

    loader = FastLoader(Plain(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    with pytest.raises(NotImplementedError, match="has no state_dict"):
        loader.state_dict()
    del it
