"""The loader's half of mid-epoch resume: ``state_dict()`` / ``load_state_dict()`` (a position,
not a history: docs/design/resume.md), a mixin of ``FastLoader``; the index stream and the
state's format are in ``gpufeed/_resume/indices.py``."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from gpufeed._resume.indices import (
    READABLE_VERSIONS,
    STATE_VERSION,
    SUPPORTED,
    Pass,
    PositionedIndices,
    apply_next_pass,
    base_sampler,
    next_pass_state,
    pass_received,
    resolve,
)
from gpufeed._resume.positions import WorkerResume
from gpufeed.errors import shorten


@dataclass
class ResumeState:
    """Where a loader stands for resume: what was loaded and is not applied yet, and the latest
    pass. ``FastLoader`` owns one (``_resume_state``); ``ResumableLoader`` reads and changes it."""

    loaded: dict[str, Any] | None = None  # a loaded state, applied at the next iter()
    loaded_workers: WorkerResume | None = None  # its workers' part, applied by the next FastIter pass
    latest: Pass | None = None  # the position of the latest pass (map-style datasets)
    user_iter: weakref.ref[Any] | None = None  # the latest iterator handed out

    def take_loaded(self) -> dict[str, Any] | None:
        """The loaded state, once (None when none is waiting): the pass starting now applies it."""
        state, self.loaded = self.loaded, None
        return state


class ResumableLoader(DataLoader):
    """``state_dict`` / ``load_state_dict`` for ``FastLoader``, on the loader's ``ResumeState``
    and the loader's own ``_epoch`` (the next pass's augmentation epoch) and image feed."""

    _resume_state: ResumeState
    _epoch: int
    _image_feed: Any
    _image_path: bool

    def _make_image_feed(self, on_gpu: bool) -> Any:
        """The image path's parent half for this loader, or None (``FastLoader`` builds it)."""
        raise NotImplementedError

    @property
    def _index_sampler(self) -> Any:
        inner = super()._index_sampler
        if isinstance(self.dataset, IterableDataset):
            return inner
        return PositionedIndices(self._resume_state, inner, self.num_workers)

    def _take_resume_workers(self) -> WorkerResume | None:
        """The loaded workers' part, for the pass that starts now (FastIter)."""
        workers, self._resume_state.loaded_workers = self._resume_state.loaded_workers, None
        if workers is not None and isinstance(self.dataset, IterableDataset):
            self._resume_state.loaded = None  # applied (a map-style state is applied by its index stream)
        return workers

    def _track_pass(self, iterator: Any, fast: bool) -> Pass | None:
        """The position record of the pass ``iterator`` starts, connected to it when it has
        workers (map-style: the pass the index stream started; an IterableDataset with workers:
        a new one, finished by the iterator). ``fast``: ``iterator`` is a ``FastIter`` (the engine's,
        with worker positions)."""
        if isinstance(self.dataset, IterableDataset):
            if not fast:
                return None
            self._resume_state.latest = Pass(started=True, aug_epoch=self._epoch - 1)
        p = self._resume_state.latest
        if p is not None and fast:
            iterator.position = p
            p.workers = iterator.positions
        return p

    def _mark_pass(self, aug_epoch: int) -> None:
        if self._resume_state.latest is not None:
            self._resume_state.latest.aug_epoch = aug_epoch

    def _pass_received(self, p: Pass) -> bool:
        return pass_received(p, super()._index_sampler)

    def _pass_in_progress(self) -> bool:
        """An iterator of this loader is alive and partway through its epoch."""
        p = self._resume_state.latest
        alive = self._resume_state.user_iter is not None and self._resume_state.user_iter() is not None
        return alive and p is not None and not self._pass_received(p)

    def state_dict(self) -> dict[str, Any]:
        """The position of the batches received so far (torchdata ``StatefulDataLoader``'s
        protocol): a small JSON-serialisable dict, version 2 (described in ``gpufeed/_resume/indices.py``).

        Load it into a loader built with the same arguments (``num_workers`` may differ; with
        ``gpufeed.DistributedSampler``, the world size too) and its next ``iter()`` yields the
        rest of the epoch. Map-style datasets with a ``SequentialSampler``, ``RandomSampler``,
        ``WeightedRandomSampler``, ``SubsetRandomSampler``, torch's or gpufeed's
        ``DistributedSampler`` (alone or in a ``BatchSampler``), ``in_order`` either way (with
        the same ``num_workers``, the workers' random states too: docs/design/resume.md);
        an ``IterableDataset`` with its own ``state_dict``/``load_state_dict`` (with workers:
        each worker's copy's, for the same ``num_workers``).

        A ``sampler`` or ``batch_sampler`` of yours resumes (without fetching a skipped batch)
        when either holds:

        - it has ``state_dict()``/``load_state_dict()`` (torchdata's protocol): its state taken
          once the received batches' indices were drawn from it is saved, and after
          ``load_state_dict()`` its next ``iter()`` must continue from there, as with
          torchdata's ``StatefulDataLoader`` (``state_dict()`` may return tensors, numpy arrays,
          bytes and tuples besides JSON types; return a new object, not one you change later);
        - or its order is a function of random state drawn when its first index is taken: its
          own ``generator`` (a ``torch.Generator`` attribute), torch's, python's or numpy's global
          RNG, and its ``epoch`` if it has ``set_epoch``. Those states are recorded at the start
          of the pass; on resume they are set while the pass's order is redrawn and the received
          batches' indices are skipped, then the process's own global RNG states are put back.

        A sampler that draws from anything else (an unseeded or private RNG, or a global RNG
        after its first index) cannot be resumed exactly: resuming compares its first indices
        with the checkpointed pass's and raises ``ValueError`` naming it where they differ; add
        ``state_dict()``/``load_state_dict()`` to it. Raises ``NotImplementedError`` for an
        ``IterableDataset`` without them, and for a sampler of yours inside Accelerate's
        ``BatchSamplerShard``.
        """
        image_seed = self._image_feed.plan.seed if self._image_feed is not None else None
        state: dict[str, Any] = {"version": STATE_VERSION}
        if isinstance(self.dataset, IterableDataset):
            dataset_state = getattr(self.dataset, "state_dict", None)
            if not callable(dataset_state) or not callable(getattr(self.dataset, "load_state_dict", None)):
                raise NotImplementedError(
                    f"state_dict() of a loader over an IterableDataset needs the dataset's own state: "
                    f"{type(self.dataset).__name__} has no state_dict()/load_state_dict(). Add them, "
                    "or checkpoint at epoch boundaries."
                )
            if self.num_workers == 0:
                state.update(epoch=self._epoch, dataset=dataset_state(), image_seed=image_seed)
                return state
            if self._resume_state.loaded is not None:  # loaded, not applied yet
                return dict(self._resume_state.loaded)
            p = self._resume_state.latest
            state.update(epoch=self._epoch, image_seed=image_seed)
            if p is not None and not p.finished and p.workers is not None:
                # each worker's copy: its state after the last batch received from it
                state.update(epoch=p.aug_epoch, workers=p.workers.state(p.yielded))
            else:
                self._add_continuing_workers(state)
            return state
        if self._resume_state.loaded is not None:  # loaded, not applied yet
            return dict(self._resume_state.loaded)
        p = self._resume_state.latest
        if p is None or not p.started or self._pass_received(p):
            # No pass in progress: the next iter() starts a fresh epoch, drawing its order from
            # next_sampler (applied at load: Lightning iter()s a resumed loader before set_epoch()).
            state.update(epoch=self._epoch, batches_yielded=0, samples_yielded=0, image_seed=image_seed,
                         sampler=None)
            next_sampler = next_pass_state(super()._index_sampler, p)
            if next_sampler is not None:
                state["next_sampler"] = next_sampler
            self._add_continuing_workers(state)
            return state
        if p.unsupported is not None:
            raise NotImplementedError(
                f"state_dict() mid-epoch supports a {SUPPORTED}. This loader's is {p.unsupported}. "
                "(Frameworks that save loader states with every checkpoint, as Lightning does: "
                "checkpoint at epoch ends, where no sampler position is needed, or use one of these.)"
            )
        run, samples, beyond = p.position()
        sampler_state = dict(p.sampler_state or {})
        if p.custom is not None:
            sampler_state = p.custom.state(run, p.skipped_samples + samples)
        elif sampler_state.get("kind") == "gpufeed_distributed":
            sampler_state["state"] = base_sampler(super()._index_sampler).state_dict(samples_per_rank=samples)
        state.update(
            epoch=p.aug_epoch,
            batches_yielded=p.skipped_batches + run,
            samples_yielded=p.skipped_samples + samples,
            image_seed=image_seed,
            sampler=sampler_state,
        )
        if beyond:
            state["delivered_beyond"] = beyond
        if p.workers is not None:
            state["workers"] = p.workers.state(p.yielded)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields the rest of that epoch."""
        if not isinstance(state_dict, dict) or "version" not in state_dict:
            raise ValueError(f"`state_dict` must be a dict from FastLoader.state_dict(). Found: {shorten(state_dict)}.")
        version = state_dict["version"]
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"FastLoader state version {version!r} is not supported; this gpufeed reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}. Load it with the gpufeed version that wrote it."
            )
        if self._pass_in_progress():
            raise RuntimeError(
                "load_state_dict() while an iterator of this loader is partway through an epoch: the "
                "state applies to the next iter(). Finish or drop the iterator first (break out of the "
                "loop and `del` it; with persistent_workers, loader.close()), or load into a new loader."
            )
        image_seed = state_dict.get("image_seed")
        if image_seed is not None and self._image_path:
            ours = self._make_image_feed(on_gpu=False)
            if ours is not None and ours.plan.seed != image_seed:
                raise ValueError(
                    f"the state was taken with image augmentation seed {image_seed}; this loader's is "
                    f"{ours.plan.seed}, so the rest of the epoch would differ. Build it with seed={image_seed}."
                )
        if isinstance(self.dataset, IterableDataset):
            self._load_iterable(state_dict)
            return
        sampler = state_dict.get("sampler")
        if sampler is not None:
            kind = resolve(super()._index_sampler)[0]
            if kind != sampler.get("kind"):
                raise ValueError(
                    f"the state was taken with a {sampler.get('kind')!r} sampler; this loader's is "
                    f"{kind or type(base_sampler(super()._index_sampler)).__name__!r}. Build it with the "
                    f"sampler of the checkpointed run ({SUPPORTED})."
                )
        next_sampler = state_dict.get("next_sampler")
        if sampler is None and next_sampler is not None:
            apply_next_pass(super()._index_sampler, next_sampler)
        self._epoch = int(state_dict["epoch"])
        self._resume_state.loaded = dict(state_dict) if sampler is not None else None
        workers = state_dict.get("workers")
        self._resume_state.loaded_workers = None
        if self.num_workers > 0 and isinstance(workers, dict) and workers.get("num_workers") == self.num_workers:
            # With another worker count the workers' random states are ignored: the position alone
            # still gives every remaining sample once (docs/design/resume.md).
            self._set_resume_workers(WorkerResume.parse(workers, self.num_workers, iterable=False))
        self._resume_state.latest = None

    def _add_continuing_workers(self, state: dict[str, Any]) -> None:
        """Between passes, with persistent workers alive: their states go into ``state``, since
        the next pass continues them (and draws no base seed) where a fresh iterator would not."""
        if self._resume_state.loaded_workers is not None:  # loaded, not applied yet
            state["workers"] = dict(self._resume_state.loaded_workers.raw)
            return
        iterator: Any = self._iterator
        positions = getattr(iterator, "positions", None)
        if self.persistent_workers and positions is not None:
            state["workers"] = positions.between_passes()

    def _set_resume_workers(self, workers: WorkerResume) -> None:
        """Apply ``workers`` at the next pass; persistent workers seeded from another base seed
        are stopped first (they cannot take the states of workers seeded otherwise)."""
        iterator: Any = self._iterator
        if iterator is not None and getattr(iterator, "base_seed", workers.base_seed) != workers.base_seed:
            iterator.close()
            self._iterator = None
        self._resume_state.loaded_workers = workers

    def _load_iterable(self, state_dict: dict[str, Any]) -> None:
        name = type(self.dataset).__name__
        load = getattr(self.dataset, "load_state_dict", None)
        workers = state_dict.get("workers")
        if not callable(load) or ("dataset" not in state_dict and workers is None and self.num_workers == 0):
            raise NotImplementedError(
                f"{name} has no load_state_dict() (or the state has no dataset part): an IterableDataset "
                "resumes through its own state."
            )
        taken_with = 0 if "dataset" in state_dict else (workers or {}).get("num_workers")
        if taken_with is not None and taken_with != self.num_workers:
            raise ValueError(
                f"the state of {name} was taken with num_workers={taken_with}; this loader has "
                f"num_workers={self.num_workers}. Each worker holds its own copy of the dataset's position: "
                f"resume with num_workers={taken_with}."
            )
        self._resume_state.loaded_workers = None
        self._resume_state.loaded = None
        if "dataset" in state_dict:
            load(state_dict["dataset"])
        elif workers is not None:
            self._set_resume_workers(WorkerResume.parse(workers, self.num_workers, iterable=True))
            self._resume_state.loaded = dict(state_dict)
        self._epoch = int(state_dict["epoch"])

