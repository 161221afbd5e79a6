"""Per-worker resume state of one pass with workers (docs/design/resume.md).

``FastIter`` records each batch it hands out with the worker that made it and that worker's
state after it (``TaskRecord.after``: its random states, and its IterableDataset copy's
``state_dict()``); ``WorkerPositions`` folds those records up to the batches the user has
received (the loader's ``Pass.yielded``, counted where batches reach the user, which may be
behind ``FastIter`` by a CUDA feed's or a framework's read-ahead), keeping per worker the state
after the last batch the user received from it. ``state()`` is the ``workers`` part of
``FastLoader.state_dict()``; ``WorkerResume`` is that part loaded back.

``workers`` (a JSON-serialisable dict)::

    num_workers  the worker count it was taken with (another count ignores it, map-style)
    base_seed    the pass's base seed (worker k was seeded from base_seed + k, as torch does)
    next         the worker of the next batch in torch's round-robin
    rng          per worker, its random states (``gpufeed._resume.rng.encode``; null: as seeded)
    datasets     IterableDataset only: per worker, its copy's ``state_dict()`` after the last
                 batch received from it (null: none received, it starts from the beginning)
    exhausted    IterableDataset only: the workers whose iterators ended within those batches
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from gpufeed._resume.rng import RngState, decode, encode
from gpufeed.errors import shorten

_END = object()  # a handout record: the worker's iterator ended (its later tasks were skipped)


@dataclass
class WorkerResume:
    """The ``workers`` part of a loaded state, checked and decoded."""

    base_seed: int
    next_worker: int
    rng: list[RngState]
    datasets: list[Any] | None  # IterableDataset only
    exhausted: list[bool]
    raw: dict[str, Any]  # as loaded (state_dict() before the pass that applies it returns it)

    @classmethod
    def parse(cls, data: Any, num_workers: int, iterable: bool) -> WorkerResume:
        """``data`` (a state's ``workers``) for a loader with ``num_workers``; ValueError if malformed."""
        where = "the state's `workers`"
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a dict from FastLoader.state_dict(). Found: {shorten(data)}.")
        try:
            n = int(data["num_workers"])
            base_seed = int(data["base_seed"])
            next_worker = int(data["next"])
            rng_data = list(data["rng"])
            datasets = list(data["datasets"]) if iterable else None
            exhausted_ids = [int(w) for w in data.get("exhausted", ())]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where} is not one FastLoader.state_dict() wrote ({exc!r}). Found: {shorten(data)}.") from exc
        if n != num_workers or len(rng_data) != n or (datasets is not None and len(datasets) != n) \
                or not 0 <= next_worker < n or any(not 0 <= w < n for w in exhausted_ids):
            raise ValueError(f"{where} does not describe {num_workers} workers. Found: {shorten(data)}.")
        rng = [decode(part, f"{where}['rng'][{w}]") for w, part in enumerate(rng_data)]
        exhausted = [w in exhausted_ids for w in range(n)]
        return cls(base_seed, next_worker, rng, datasets, exhausted, dict(data))


class WorkerPositions:
    """One pass's per-worker states as of the batches the user received (see the module doc)."""

    def __init__(self, num_workers: int, base_seed: int, start_worker: int, rng: list[RngState | None],
                 datasets: list[Any] | None, exhausted: list[bool] | None = None) -> None:
        self.num_workers = num_workers
        self.base_seed = base_seed
        self._next = start_worker  # the worker of the next batch, as of the folded ones
        self._rng: list[RngState | None] = list(rng)
        self._datasets = list(datasets) if datasets is not None else None
        self._exhausted = list(exhausted) if exhausted is not None else [False] * num_workers
        self._handouts: deque[tuple[int, Any]] = deque()  # (worker, TaskRecord.after or _END)
        self._folded = 0  # batches folded

    def handout(self, worker_id: int, after: tuple[Any, Any] | None) -> None:
        """A batch of ``worker_id`` went out; ``after``: its state after it (None: not reported,
        e.g. a batch the plug-in made in the parent)."""
        self._handouts.append((worker_id, after))

    def ended(self, worker_id: int) -> None:
        """``worker_id``'s iterator ended, after the batches handed out so far."""
        self._handouts.append((worker_id, _END))

    def fold(self, received: int) -> None:
        """Take in the records of the first ``received`` batches (and any end right after them)."""
        while self._handouts:
            worker_id, after = self._handouts[0]
            if after is not _END and self._folded >= received:
                break
            self._handouts.popleft()
            if after is _END:
                self._exhausted[worker_id] = True
                continue
            self._folded += 1
            self._next = (worker_id + 1) % self.num_workers
            if after is not None:
                rng, dataset_state = after
                self._rng[worker_id] = rng
                if self._datasets is not None:
                    self._datasets[worker_id] = dataset_state

    def carry(self) -> list[RngState | None]:
        """Every worker's random states after all the batches handed out (a persistent worker's
        start in the next pass)."""
        self.fold(self._folded + len(self._handouts))
        return list(self._rng)

    def between_passes(self) -> dict[str, Any]:
        """The ``workers`` part after this pass, for the next one (persistent workers): every
        worker's random states after all its batches; IterableDataset copies start afresh."""
        rng = self.carry()
        out: dict[str, Any] = {"num_workers": self.num_workers, "base_seed": self.base_seed, "next": 0,
                               "rng": [encode(r) for r in rng]}
        if self._datasets is not None:
            out.update(datasets=[None] * self.num_workers, exhausted=[])
        return out

    def state(self, received: int) -> dict[str, Any]:
        """The ``workers`` part of the loader's state after ``received`` batches of the pass."""
        self.fold(received)
        out: dict[str, Any] = {
            "num_workers": self.num_workers,
            "base_seed": self.base_seed,
            "next": self._next,
            "rng": [encode(r) for r in self._rng],
        }
        if self._datasets is not None:
            out["datasets"] = list(self._datasets)
            out["exhausted"] = [w for w in range(self.num_workers) if self._exhausted[w]]
        return out
