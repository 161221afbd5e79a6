"""HF Accelerate: prepare a FastLoader for a rank and keep gpufeed's engine.

``accelerator.prepare(loader)`` replaces any DataLoader by Accelerate's ``DataLoaderShard``, which
wraps a plain ``torch.utils.data.DataLoader`` built from the torch arguments only: gpufeed's
workers, image path and options are gone (FastLoader warns when that happens). Instead::

    from gpufeed.integrations.accelerate import prepare

    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare(accelerator, loader)  # an AcceleratedFastLoader

Accelerate decides the sharding exactly as for its own loaders (its ``prepare_data_loader`` with
the accelerator's settings: ``BatchSamplerShard``, ``split_batches``, ``even_batches``, seedable
sampler, RNG synchronisation); the returned loader is a FastLoader over that sharded batch sampler
that also does ``DataLoaderShard``'s per-epoch work: synchronises the sampler's generator across
ranks, advances the sampler epoch, places batches on ``accelerator.device`` (CUDA through
gpufeed's own ``device=`` feed), and keeps ``GradientState`` informed (``end_of_dataloader``,
``remainder``), so ``gather_for_metrics`` drops the padded duplicates of the last step and
``accumulate`` syncs at the end of the epoch. It is registered with the accelerator (``save_state``
and ``join_uneven_inputs`` see it; ``accelerator.prepare`` returns it unchanged).

A loader whose sampler already shards for this world size (a ``torch.utils.data.DistributedSampler``,
such as ``gpufeed.DistributedSampler``) keeps it: Accelerate would shard it a second time (each
rank seeing half of its own share). ``gather_for_metrics`` cannot tell that sampler's padding
from real samples (``remainder`` is -1): evaluate with Accelerate's sharding, or gather once
after the loop.

Checkpoints: with ``DataLoaderConfiguration(use_stateful_dataloader=True)``,
``accelerator.save_state()`` stores the loader's ``state_dict()`` and ``load_state()`` loads it,
so the next epoch's iteration resumes mid-epoch, exactly (no torchdata needed). Otherwise use
Accelerate's recipe with :func:`skip_first_batches` (skips indices, never decodes them).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, IterableDataset
from torch.utils.data import DistributedSampler as _TorchDistributedSampler

try:
    from accelerate import Accelerator
    from accelerate.data_loader import DataLoaderShard, DataLoaderStateMixin, SkipBatchSampler, get_sampler
    from accelerate.data_loader import prepare_data_loader as _accelerate_prepare_data_loader
    from accelerate.state import GradientState
    from accelerate.utils import DistributedType, send_to_device, synchronize_rng_states
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"gpufeed.integrations.accelerate needs HF Accelerate ({exc}). Install it with "
        "`pip install 'gpufeed[accelerate]'`."
    ) from exc

from gpufeed.errors import check_int, shorten
from gpufeed.loader import FastLoader

__all__ = ["AccelerateSetup", "AcceleratedFastLoader", "prepare", "skip_first_batches"]

T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, eq=False)
class AccelerateSetup:
    """What Accelerate decided for one rank's loader (made by :func:`prepare`).

    Attributes:
        rng_types: RNGs synchronised from rank 0 at each ``iter()`` (Accelerate's ``rng_types``).
        synchronized_generator: the sampler's generator that ``"generator"`` synchronises.
        send_device: batches are sent there with Accelerate's ``send_to_device``; None when no
            placement is asked, or when gpufeed's ``device=`` feed places them (CUDA).
        non_blocking: ``send_to_device``'s ``non_blocking``.
        drop_last: the prepared loader's ``drop_last`` (no remainder when True).
        total_batch_size: samples per step over all ranks; None when unknown.
        num_processes: the ranks that share the data.
        sharded_by: ``"accelerate"`` (its ``BatchSamplerShard``), ``"sampler"`` (the loader's own
            ``DistributedSampler``) or ``"none"`` (one process).
        stateful: ``accelerator.save_state()`` / ``load_state()`` carry the loader's state
            (Accelerate's ``use_stateful_dataloader``).
    """

    rng_types: tuple[str, ...] = ()
    synchronized_generator: torch.Generator | None = None
    send_device: torch.device | None = None
    non_blocking: bool = False
    drop_last: bool = False
    total_batch_size: int | None = None
    num_processes: int = 1
    sharded_by: str = "none"
    stateful: bool = False


class AcceleratedFastLoader(FastLoader[T_co], DataLoaderStateMixin):
    """A FastLoader prepared for one Accelerate rank: made by :func:`prepare`, not directly.

    Batches come from gpufeed's engine; around them it does what Accelerate's ``DataLoaderShard``
    does (one batch read ahead to know the last one, device placement, ``GradientState``, sampler
    epoch and RNG synchronisation). ``iteration`` is the epoch of the next ``iter()`` (+1 after
    each complete one; ``set_epoch`` sets it). ``state_dict()`` counts the batches the loop has
    received (not the one read ahead) and records the world size, which must match on resume
    unless the loader shards with ``gpufeed.DistributedSampler``.
    """

    def __init__(self, dataset: Any, *args: Any, accelerate: AccelerateSetup, **kwargs: Any) -> None:
        if not isinstance(accelerate, AccelerateSetup):
            raise TypeError(f"`accelerate` must be an AccelerateSetup. Found: {shorten(accelerate)}.")
        self.accelerate = accelerate
        self.iteration = 0
        self.gradient_state = GradientState()
        self.end_of_dataloader = False
        self.remainder = -1
        super().__init__(dataset, *args, **kwargs)
        self.use_stateful_dataloader = accelerate.stateful  # read by accelerator.save_state/load_state
        self._is_accelerate_prepared = True  # accelerator.prepare(loader) returns it as is

    def _init_kwargs(self) -> dict[str, Any]:
        kwargs = super()._init_kwargs()
        kwargs["accelerate"] = self.accelerate
        return kwargs

    # -- DataLoaderShard's bookkeeping -------------------------------------------------------------

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step over all ranks (None when the batch sampler has no fixed size)."""
        return self.accelerate.total_batch_size

    @property
    def total_dataset_length(self) -> int:
        """Length of the whole dataset (all ranks)."""
        dataset: Any = self.dataset
        return int(getattr(dataset, "total_length", None) or len(dataset))

    def begin(self) -> None:
        """Register with ``GradientState`` for one epoch and compute ``remainder``: the real
        samples in the last step over all ranks, which ``gather_for_metrics`` keeps."""
        self.reset()
        setup = self.accelerate
        if setup.sharded_by != "sampler" and not setup.drop_last and setup.total_batch_size:
            with contextlib.suppress(TypeError):  # a dataset without len()
                self.remainder = self.total_dataset_length % setup.total_batch_size
        self.gradient_state._add_dataloader(self)

    def get_sampler(self) -> Any:
        """The per-sample sampler (Accelerate's ``get_sampler``; its checkpointing reads it)."""
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Replace the per-sample sampler inside the batch sampler (as ``DataLoaderShard``)."""
        DataLoaderShard.set_sampler(self, sampler)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next ``iter()``: augmentation epoch, ``iteration``, and the
        ``set_epoch`` of the samplers (also inside Accelerate's ``BatchSamplerShard``), else of
        the dataset. ``iter()`` calls it with ``iteration``, as ``DataLoaderShard`` does."""
        super().set_epoch(epoch)
        self.iteration = epoch
        reached = self._epoch_samplers()
        inner: Any = getattr(getattr(self.batch_sampler, "batch_sampler", None), "sampler", None)
        if callable(getattr(inner, "set_epoch", None)) and all(s is not inner for s in reached):
            inner.set_epoch(epoch)
        elif not reached and callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, as DataLoaderShard's
        setup = self.accelerate
        if setup.rng_types:  # a collective: every rank starts its epoch here
            synchronize_rng_states(list(setup.rng_types), setup.synchronized_generator)
        self.begin()
        try:
            self.set_epoch(self.iteration)
            batches = super().__iter__()
            position = self._resume_state.latest if not isinstance(self.dataset, IterableDataset) else None
            if position is not None:  # counted here, where the loop receives them (one is read ahead)
                position.count_pulls = False
                if hasattr(batches, "on_yield"):
                    batches.on_yield = None
            yield from self._read_ahead(batches, position)
            self.iteration += 1
        finally:
            self.end()

    def _read_ahead(self, batches: Iterator[Any], position: Any) -> Iterator[Any]:
        setup = self.accelerate
        try:
            current = next(batches)
        except StopIteration:
            return
        while True:
            if setup.send_device is not None:
                current = send_to_device(current, setup.send_device, non_blocking=setup.non_blocking)
            try:
                following = next(batches)
            except StopIteration:
                self.end_of_dataloader = True
                following = None
            if position is not None:
                position.yielded += 1
            yield current
            if following is None:
                return
            current = following

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """FastLoader's state of the batches the loop received, plus ``accelerate``: the world size
        and sharding it was taken with, and ``iteration``."""
        state = super().state_dict()
        setup = self.accelerate
        state["accelerate"] = {
            "num_processes": setup.num_processes,
            "sharded_by": setup.sharded_by,
            "iteration": self.iteration,
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields the rest of that epoch.

        Raises ValueError when the state was taken on another number of processes with
        Accelerate's sharding (a rank's batch count then names other samples); a state of
        ``gpufeed.DistributedSampler`` resumes on any world size.
        """
        ours = self.accelerate
        theirs = state_dict.get("accelerate") if isinstance(state_dict, dict) else None
        mid_epoch = isinstance(state_dict, dict) and state_dict.get("sampler") is not None
        sampler = state_dict.get("sampler") if mid_epoch else None
        world_free = isinstance(sampler, dict) and sampler.get("kind") == "gpufeed_distributed"
        if isinstance(theirs, dict) and mid_epoch and not world_free:
            if theirs.get("num_processes") != ours.num_processes or theirs.get("sharded_by") != ours.sharded_by:
                raise ValueError(
                    f"the state was taken on {theirs.get('num_processes')} process(es) sharded by "
                    f"{theirs.get('sharded_by')!r}; this loader runs on {ours.num_processes} sharded by "
                    f"{ours.sharded_by!r}, where its batch count names other samples. Resume on the same "
                    "number of processes, or shard with gpufeed.DistributedSampler (resumes on any world size)."
                )
        super().load_state_dict(state_dict)
        if isinstance(theirs, dict) and isinstance(theirs.get("iteration"), int):
            self.iteration = theirs["iteration"]
        else:
            self.iteration = int(state_dict["epoch"])


def prepare(
    accelerator: Accelerator, loader: FastLoader[T_co], *, device_placement: bool | None = None
) -> AcceleratedFastLoader[T_co]:
    """Prepare ``loader`` for this rank as ``accelerator.prepare`` would, keeping gpufeed's engine.

    Args:
        accelerator: the ``accelerate.Accelerator`` of the run (its process group is up).
        loader: a FastLoader, built as for one process (Accelerate shards it), or with a
            ``DistributedSampler`` for this world size (kept as it is).
        device_placement: place batches on ``accelerator.device``; default: the accelerator's
            ``device_placement``. On CUDA, gpufeed's ``device=`` feed does it (pinned arena, its
            own stream, normalize on the GPU) unless the loader has a ``device`` already.

    Returns:
        An :class:`AcceleratedFastLoader`, registered with the accelerator.
    """
    if isinstance(loader, AcceleratedFastLoader):
        again: AcceleratedFastLoader[T_co] = accelerator.prepare_data_loader(loader)
        return again
    if not isinstance(loader, FastLoader):
        raise TypeError(
            f"`loader` must be a gpufeed FastLoader. Found: {type(loader).__name__}. Prepare other "
            "loaders with accelerator.prepare()."
        )
    if accelerator.distributed_type == DistributedType.XLA:
        raise NotImplementedError("gpufeed.integrations.accelerate does not support XLA (TPU) runs.")
    if accelerator.dispatch_batches:
        raise NotImplementedError(
            "dispatch_batches=True (rank 0 loads every batch and sends slices to the others) is not "
            "supported: with gpufeed every rank loads its own share. Use "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))."
        )
    if device_placement is None:
        device_placement = bool(accelerator.device_placement)
    world = accelerator.num_processes
    own_sampler = _sharding_sampler(loader)
    if own_sampler is not None and own_sampler.num_replicas != world:
        raise ValueError(
            f"the loader's {type(own_sampler).__name__} shards over num_replicas={own_sampler.num_replicas}, "
            f"but the accelerator runs {world} process(es). Build it with num_replicas=accelerator.num_processes "
            "and rank=accelerator.process_index (the defaults under accelerate launch / torchrun)."
        )
    shard = _accelerate_shard(accelerator, loader, world if own_sampler is None else 1)
    iterable = isinstance(loader.dataset, IterableDataset)
    overrides: dict[str, Any] = {}
    if shard.dataset is not loader.dataset:
        overrides["dataset"] = shard.dataset  # Accelerate's IterableDatasetShard
    if iterable:
        if shard.batch_size != loader.batch_size:
            overrides["batch_size"] = shard.batch_size
    elif isinstance(loader.sampler, BatchSampler):  # a BatchSampler given as `sampler`
        overrides.update(sampler=shard.sampler, batch_size=loader.batch_size)
    else:
        overrides["batch_sampler"] = shard.batch_sampler
    send_device = None
    if device_placement:
        device = torch.device(accelerator.device)
        if device.type == "cuda" and loader.device is None:
            overrides["device"] = device  # gpufeed's CUDA feed places the batches
        elif loader.device is None:
            send_device = device
    total_batch_size = None
    with contextlib.suppress(Exception):  # a batch sampler without a fixed batch_size
        total_batch_size = int(shard.total_batch_size)
    if own_sampler is not None and loader.batch_size is not None:
        total_batch_size = loader.batch_size * world
    setup = AccelerateSetup(
        rng_types=tuple(str(getattr(r, "value", r)) for r in (shard.rng_types or ())),
        synchronized_generator=shard.synchronized_generator,
        send_device=send_device,
        non_blocking=bool(accelerator.non_blocking),
        drop_last=bool(loader.drop_last),
        total_batch_size=total_batch_size,
        num_processes=world,
        sharded_by="none" if world == 1 else ("sampler" if own_sampler is not None else "accelerate"),
        stateful=bool(getattr(accelerator, "use_stateful_dataloader", False)),
    )
    kwargs = loader._replace_kwargs(overrides)
    prepared: AcceleratedFastLoader[T_co] = AcceleratedFastLoader(**kwargs, accelerate=setup)
    registered: AcceleratedFastLoader[T_co] = accelerator.prepare_data_loader(prepared)  # registers it
    return registered


def skip_first_batches(loader: AcceleratedFastLoader[T_co], num_batches: int) -> AcceleratedFastLoader[T_co]:
    """A loader whose iterations skip the first ``num_batches`` of this rank (Accelerate's resume
    recipe, as ``accelerator.skip_first_batches``): indices are skipped, nothing is decoded."""
    if not isinstance(loader, AcceleratedFastLoader):
        raise TypeError(
            f"`loader` must come from gpufeed.integrations.accelerate.prepare(). Found: {type(loader).__name__}."
        )
    check_int("num_batches", num_batches, 0)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is not None:
        raise NotImplementedError(
            "skip_first_batches() needs a map-style dataset prepared with a batch sampler; resume this "
            "loader with DataLoaderConfiguration(use_stateful_dataloader=True) and accelerator.load_state()."
        )
    skipped = loader.replace(batch_sampler=SkipBatchSampler(loader.batch_sampler, skip_batches=num_batches))
    assert isinstance(skipped, AcceleratedFastLoader)
    skipped.iteration = loader.iteration
    return skipped


def _sharding_sampler(loader: FastLoader[Any]) -> _TorchDistributedSampler[Any] | None:
    """The loader's ``DistributedSampler`` (or one inside its batch sampler), if it has one."""
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(sampler, _TorchDistributedSampler):
            return sampler
    return None


def _accelerate_shard(accelerator: Accelerator, loader: FastLoader[Any], num_processes: int) -> Any:
    """Accelerate's own ``DataLoaderShard`` for ``loader`` (never iterated: its sharded batch
    sampler, dataset and RNG set-up are what the prepared FastLoader takes)."""
    options: dict[str, Any] = {
        "device": accelerator.device,
        "num_processes": num_processes,
        "process_index": accelerator.process_index if num_processes > 1 else 0,
        "split_batches": accelerator.split_batches,
        "put_on_device": False,  # placed by the prepared loader
        "rng_types": list(accelerator.rng_types),
        "dispatch_batches": False,
        "even_batches": accelerator.even_batches,
        "use_seedable_sampler": accelerator.use_seedable_sampler,
        "data_seed": getattr(getattr(accelerator, "dataloader_config", None), "data_seed", None),
        "non_blocking": accelerator.non_blocking,
        "use_stateful_dataloader": False,  # gpufeed's own state; no torchdata needed
    }
    mesh = getattr(accelerator, "_prepare_device_mesh", None)
    if callable(mesh):
        options["torch_device_mesh"] = mesh()
    accepted = inspect.signature(_accelerate_prepare_data_loader).parameters
    loader.__dict__["_rebuild_expected"] = True  # no warning: this DataLoader is never iterated
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's worker-count advice, given by the real loader
            shard = _accelerate_prepare_data_loader(loader, **{k: v for k, v in options.items() if k in accepted})
    finally:
        loader.__dict__.pop("_rebuild_expected", None)
    if not isinstance(shard, DataLoaderShard):
        raise NotImplementedError(
            f"Accelerate prepared a {type(shard).__name__} for this loader; gpufeed supports its "
            "DataLoaderShard path (per-rank sharding) only."
        )
    return shard
