"""Samplers and batch samplers of a user's, as the custom-sampler resume tests meet them (module
level: the loaders' workers may be spawned)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler


class OwnGeneratorShuffle(Sampler[int]):
    """Shuffles with its own ``generator`` at its first index (as torch's RandomSampler): every
    pass draws a new order from it."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.n, generator=self.generator).tolist()

    def __len__(self) -> int:
        return self.n


class GlobalShuffle(Sampler[int]):
    """Shuffles at ``iter()`` with a global RNG: torch's, python's ``random`` or numpy's."""

    def __init__(self, n: int, source: str) -> None:
        self.n, self.source = n, source

    def __iter__(self) -> Iterator[int]:
        if self.source == "torch":
            order = torch.randperm(self.n).tolist()
        elif self.source == "random":
            order = list(range(self.n))
            random.shuffle(order)
        else:
            order = np.random.permutation(self.n).tolist()
        return iter(order)

    def __len__(self) -> int:
        return self.n


class Backwards(Sampler[int]):
    """No randomness at all."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


class Unseeded(Sampler[int]):
    """Shuffles with a private RNG seeded from the OS: its order cannot be redrawn."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        random.Random().shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return self.n


class EpochCursor(Sampler[int]):
    """torchdata's protocol as its StatefulDistributedSampler keeps it: the order is a function
    of (seed, epoch); ``state_dict()`` is the position in the pass (stale until the next pass's
    iterator starts); ``load_state_dict()`` makes the next ``iter()`` continue from it. Its state
    holds a tuple and a tensor, as real ones do."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0
        self.yielded = 0
        self.next_yielded: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded = self.next_yielded or 0
        self.next_yielded = None
        for i in order[self.yielded:]:
            self.yielded += 1
            yield i

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded, "where": (self.seed, self.epoch), "check": torch.tensor([self.n])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert isinstance(state["where"], tuple) and int(state["check"]) == self.n
        self.next_yielded = state["yielded"]
        self.epoch = state["where"][1]


class PrivateDraws(Sampler[int]):
    """torchdata's README sampler, per pass: draws each index (with replacement) from a private
    generator as it goes; its state is that generator and the place in the pass."""

    def __init__(self, n: int, per_pass: int, seed: int) -> None:
        self.n, self.per_pass = n, per_pass
        self._g = torch.Generator().manual_seed(seed)
        self.pos = 0

    def __iter__(self) -> Iterator[int]:
        while self.pos < self.per_pass:
            self.pos += 1
            yield int(torch.randint(self.n, (), generator=self._g))
        self.pos = 0

    def __len__(self) -> int:
        return self.per_pass

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos, "rng": self._g.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]
        self._g.set_state(state["rng"])


SIZES = (3, 1, 4, 2, 5)


class VariableBatches(Sampler[list[int]]):
    """A batch_sampler: a shuffled order from its own generator, cut into batches of varying size."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def _batches(self) -> list[list[int]]:
        order = torch.randperm(self.n, generator=self.generator).tolist()
        out, at, k = [], 0, 0
        while at < self.n:
            out.append(order[at:at + SIZES[k % len(SIZES)]])
            at += len(out[-1])
            k += 1
        return out

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._batches()

    def __len__(self) -> int:
        at, k = 0, 0
        while at < self.n:
            at += SIZES[k % len(SIZES)]
            k += 1
        return k


class StatefulVariableBatches(VariableBatches):
    """The same batches, resumed through its own state: the batches of this pass handed out, and
    the generator state the pass drew from."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, seed)
        self.taken = 0
        self.start = self.generator.get_state()
        self._resume: int | None = None

    def __iter__(self) -> Iterator[list[int]]:
        if self._resume is None:
            self.start = self.generator.get_state()
        else:
            self.generator.set_state(self.start)
        batches = self._batches()
        self.taken, self._resume = self._resume or 0, None
        for batch in batches[self.taken:]:
            self.taken += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"taken": self.taken, "start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start, self._resume = state["start"], state["taken"]
