"""Sharding a map-style dataset across ranks, without a framework.

``DistributedSampler`` takes ``torch.utils.data.DistributedSampler``'s arguments and gives the
same indices for the same ``(seed, epoch)``, plus two things torch's lacks:

* ``mode="eval"``: every sample is seen exactly once across ranks, with no padded duplicates
  (ranks may then differ by one sample; see below).
* A position in the epoch that does not depend on the world size, so a job checkpointed on
  ``W`` ranks resumes on ``W'`` ranks without losing or repeating a sample.

**The global order.** An epoch's order is one permutation of all ``N`` indices, drawn from
``torch.Generator().manual_seed(seed + epoch)`` exactly as torch's sampler draws it (``range(N)``
with ``shuffle=False``). The world size plays no part in it.

**Interleaved, not blocks.** Rank ``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...`` of
that order (as torch does). Why interleaved: once every rank has taken ``k`` samples, the samples
taken by all ranks together are exactly the first ``W * k`` positions of the global order, a
prefix. A prefix is one number (``position``) that means the same thing on any world size:
the rest of the epoch is ``order[position:]``, which the new ranks interleave again. With
contiguous blocks, ``k`` samples per rank are ``W`` separate runs of the order, which a different
``W'`` cannot continue without a list of what was seen.

**Train and eval.** ``mode="train"`` (the default, torch's behaviour) gives every rank the same
number of samples, so a collective per batch never hangs: the tail is padded by wrapping round
the samples left in the order (a few repeat in the last step), or dropped with ``drop_last=True``.
``mode="eval"`` pads nothing: rank ``r`` gets ``ceil((R - r) / W)`` of the ``R`` samples left,
so the last step has fewer samples on some ranks, possibly none. The evaluation loop must then
not run a collective per batch (gather the results once, after the loop), or must use
``max_num_samples`` to add empty steps on the ranks that ran out.

**Resume across world sizes.** ``state_dict(samples_per_rank=k)`` records
``(seed, epoch, position)`` with ``position = start + W * k``, capped at ``N``, where ``start``
is where this iteration began and ``k`` the samples every rank has taken (the same ``k`` on all
ranks: take the checkpoint at a step all ranks reached). A sampler on any world size that
``load_state_dict``-s it yields, in that epoch, only ``order[position:]``, shared out
between its ranks as above: no sample of the epoch is lost or repeated across the change.
(In ``mode="train"`` the epoch's last step still pads or drops, as in any epoch.) Without
``samples_per_rank``, ``k`` is the number of indices this sampler has handed out in its current
iteration; a loader with workers pulls indices ahead of the batches you have received, so pass
the samples your loop has actually consumed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

from gpufeed.errors import check_int

__all__ = ["DistributedSampler"]

_MODES = ("train", "eval")


class DistributedSampler(_TorchDistributedSampler[int]):
    """Shard a map-style dataset across ranks in a world-size-independent global order.

    A subclass of ``torch.utils.data.DistributedSampler`` (so frameworks that check for one do
    not wrap it again), with the same arguments, attributes (``num_replicas``, ``rank``,
    ``epoch``, ``shuffle``, ``seed``, ``drop_last``, ``num_samples``, ``total_size``), indices
    and ``len()``, plus ``mode`` and a resumable position. See the module docstring.

    Args:
        dataset: a map-style dataset (anything with ``len()``).
        num_replicas: the world size; default ``torch.distributed.get_world_size()``.
        rank: this process's rank; default ``torch.distributed.get_rank()``.
        shuffle: draw the order from ``(seed, epoch)``; otherwise ``0 .. N-1``.
        seed: the same on every rank.
        drop_last: in ``mode="train"``, drop the tail instead of padding it.
        mode: ``"train"``: the same number of samples on every rank (padded or dropped tail);
            ``"eval"``: every sample exactly once across ranks, counts may differ by one.

    Example:
        ```python
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = FastLoader(dataset, batch_size=64, sampler=sampler, num_workers=8)
        for epoch in range(start_epoch, epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                ...
        ```
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        mode: Literal["train", "eval"] = "train",
    ) -> None:
        # torch's __init__ is not called: it would compute num_samples before ``mode`` is known.
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                "`dataset` must be a map-style dataset with len(); an IterableDataset shards "
                f"itself (use get_worker_info() and the rank). Found: {type(dataset).__name__}."
            )
        num_replicas = _world_size() if num_replicas is None else num_replicas
        rank = _rank() if rank is None else rank
        check_int("num_replicas", num_replicas, 1, typed=True)
        check_int("rank", rank, 0, typed=True)
        if rank >= num_replicas:
            raise ValueError(f"`rank` must be in [0, num_replicas - 1] = [0, {num_replicas - 1}]. Found: {rank}.")
        check_int("seed", seed, typed=True)
        if mode not in _MODES:
            raise ValueError(f'`mode` must be "train" or "eval". Found: {mode!r}.')
        if mode == "eval" and drop_last:
            raise ValueError(
                '`drop_last=True` drops samples that `mode="eval"` promises to yield exactly once. '
                'Found: drop_last=True with mode="eval". Pass drop_last=False, or mode="train".'
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.mode = mode
        self.epoch = 0
        self._start = 0  # where this epoch's iterations begin in the global order (resume)
        self._yielded = 0
        self._refresh()

    # -- the global order ------------------------------------------------------------------

    def global_order(self) -> list[int]:
        """All indices of this epoch in their global order (the same on any world size)."""
        n = self._len()
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=generator).tolist()

    def _shard(self, order: list[int], start: int) -> list[int]:
        rest = order[start:]
        if self.mode == "eval":
            return rest[self.rank :: self.num_replicas]
        per_rank = _per_rank(len(rest), self.num_replicas, self.drop_last)
        total = per_rank * self.num_replicas
        if total > len(rest):  # pad by wrapping round what is left, as torch does
            pad = total - len(rest)
            rest = rest + (rest * math.ceil(pad / len(rest)))[:pad]
        return rest[self.rank : total : self.num_replicas]

    def _refresh(self) -> None:
        remaining = self._len() - self._start
        if self.mode == "eval":
            self.num_samples = max(0, math.ceil((remaining - self.rank) / self.num_replicas))
            self.total_size = remaining
        else:
            self.num_samples = _per_rank(remaining, self.num_replicas, self.drop_last)
            self.total_size = self.num_samples * self.num_replicas

    @property
    def max_num_samples(self) -> int:
        """The most samples any rank gets in an iteration (``num_samples`` in train mode)."""
        remaining = self._len() - self._start
        if self.mode == "eval":
            return math.ceil(remaining / self.num_replicas)
        return _per_rank(remaining, self.num_replicas, self.drop_last)

    # -- torch's sampler interface --------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        indices = self._shard(self.global_order(), min(self._start, self._len()))
        self._yielded = 0
        return self._count(indices)

    def _len(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style: checked in __init__

    def _count(self, indices: list[int]) -> Iterator[int]:
        for index in indices:
            self._yielded += 1
            yield index

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch (as torch's): the order is drawn from ``(seed, epoch)``.

        Setting the epoch a loaded state belongs to keeps its position (every iteration of that
        epoch starts there, as every iteration of an epoch gives the same order); any other
        epoch starts at its beginning.
        """
        check_int("epoch", epoch, 0, typed=True)
        if epoch != self.epoch:
            self._start = 0
            self._yielded = 0
        self.epoch = epoch
        self._refresh()

    # -- position ------------------------------------------------------------------------

    def global_position(self, samples_per_rank: int) -> int:
        """Position in the global order once every rank has taken ``samples_per_rank`` samples
        of the current iteration: ``start + num_replicas * samples_per_rank``, capped at ``N``."""
        check_int("samples_per_rank", samples_per_rank, 0, typed=True)
        position = self._start + self.num_replicas * samples_per_rank
        return min(position, self._len())

    def state_dict(self, samples_per_rank: int | None = None) -> dict[str, Any]:
        """``(seed, epoch, position)`` and what must match on resume; valid on any world size.

        Args:
            samples_per_rank: samples every rank has consumed in the current iteration;
                default: the indices this sampler has handed out (over-counts when a loader
                prefetches; pass what the loop received).
        """
        k = self._yielded if samples_per_rank is None else samples_per_rank
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.global_position(k),
            "shuffle": self.shuffle,
            "dataset_len": self._len(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: iterations of the state's epoch yield this rank's share of ``order[position:]``."""
        n = self._len()
        for key, ours in (("seed", self.seed), ("shuffle", self.shuffle), ("dataset_len", n)):
            if state[key] != ours:
                raise ValueError(
                    f"The state's `{key}` must match this sampler's ({ours!r}), or the global order "
                    f"differs and samples would be lost or repeated. Found: {state[key]!r}. "
                    f"Build the sampler with the {key} of the checkpointed run."
                )
        position = state["position"]
        check_int("position", position, 0, typed=True)
        if position > n:
            raise ValueError(f"`position` must be <= len(dataset) = {n}. Found: {position}.")
        check_int("epoch", state["epoch"], 0, typed=True)
        self.epoch = state["epoch"]
        self._start = position
        self._yielded = 0
        self._refresh()


def _per_rank(remaining: int, num_replicas: int, drop_last: bool) -> int:
    if drop_last:
        return remaining // num_replicas
    return math.ceil(remaining / num_replicas)


def _require_process_group(argument: str) -> None:
    if not dist.is_available():
        raise RuntimeError(
            f"`{argument}` was not given and this torch build has no torch.distributed. "
            f"Pass num_replicas= and rank= explicitly."
        )
    if not dist.is_initialized():
        raise ValueError(
            f"`{argument}` was not given and the default process group is not initialised. "
            "Call torch.distributed.init_process_group() first (torchrun sets the environment "
            "it reads), or pass num_replicas= and rank= explicitly."
        )


def _world_size() -> int:
    _require_process_group("num_replicas")
    return dist.get_world_size()


def _rank() -> int:
    _require_process_group("rank")
    return dist.get_rank()
