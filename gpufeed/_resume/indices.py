"""A loader's mid-epoch position, not its history (docs/design/resume.md, "Position, not history").

The state of a pass is where its index stream started and how many batches the user received:
resuming rebuilds the same index stream and skips that many batches of *indices* (no fetch, no
decode); the image path's augmentation is keyed by ``(seed, epoch, index)``, so the rest of the
epoch is byte-identical. ``gpufeed.DistributedSampler`` keeps its own world-size-independent
position instead (``state_dict(samples_per_rank=k)``), so its ranks may change on resume.

State, version 2 (a JSON-serialisable dict; version 1, the same without ``workers``, still loads)::

    version          2
    epoch            augmentation epoch of the pass (the next pass, if none is in progress)
    batches_yielded  batches of that pass received by the user, counted as the longest run from
                     the pass's start with none missing (with in_order=True: all of them)
    samples_yielded  sample indices in those batches
    delivered_beyond optional, in_order=False only: batches received past that run, as offsets
                     from its end (1 = the batch after the first missing one), skipped on resume
    image_seed       the image path's augmentation seed, else None
    sampler          None (no pass in progress: the next iter() starts a fresh epoch), or
                     {"kind": "sequential"}
                     {"kind": "random", "seed": int}  (RandomSampler without a generator: the seed
                         it drew from torch's global RNG)
                     {"kind": "random", "generator_state": base64}  (the state of its generator
                         before the epoch's draw)
                     {"kind": "weighted_random" or "subset_random", "generator_state": base64}
                         (WeightedRandomSampler, SubsetRandomSampler: the state of the generator
                         the epoch's order was drawn from, theirs or torch's global one)
                     {"kind": "gpufeed_distributed", "state": DistributedSampler.state_dict(...)}
                     {"kind": "stateful", ...} or {"kind": "custom", ...}  (a sampler or batch
                         sampler of the user's: with its own state_dict(), or redrawn from the RNG
                         states its pass started from; described in gpufeed/_resume/sampler_state.py)
                     {"kind": "torch_distributed", "epoch": int, "seed": int, "shuffle": bool,
                         "drop_last": bool, "num_replicas": int, "dataset_len": int}
                         (torch's DistributedSampler, e.g. the one Lightning injects: its order is a
                         function of these; no rank, so rank 0's state, the one a framework
                         checkpoints, is every rank's: all ranks take the same number of batches)
    next_sampler     only with sampler None (taken between passes, or once every batch of the pass
                     was received), where the next pass's order comes from, applied by
                     load_state_dict() at once (a framework may iter() before its set_epoch()):
                     {"kind": "random", "weighted_random" or "subset_random", "generator_state":
                         base64}  (the sampler's own generator now)
                     {"kind": "torch_distributed" or "gpufeed_distributed", "epoch": int}  (the
                         epoch of the last pass + 1, as a set_epoch(epoch) loop counts)
                     {"kind": "custom", "sampler": class name, "generator_state": base64 and/or
                         "epoch": int}  (a custom sampler with its own generator or set_epoch)
    dataset          IterableDataset at num_workers=0 only: its own ``state_dict()``
    workers          with num_workers > 0, mid-pass: the workers' random states, the pass's base
                     seed and round-robin position, and for an IterableDataset each worker's copy's
                     ``state_dict()`` (``gpufeed/_resume/positions.py``); used with the same
                     num_workers only (docs/design/resume.md)
    accelerate       gpufeed.integrations.accelerate's loaders only: {"num_processes", "sharded_by",
                     "iteration"} (Accelerate's sharding: resume on the same number of processes)
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

from gpufeed._resume import sampler_state as _sampler_state
from gpufeed._resume.sampler_state import CUSTOM_KINDS, CustomPosition, custom_kind
from gpufeed.sampler import DistributedSampler

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)  # states this gpufeed loads

SUPPORTED = (
    "SequentialSampler, RandomSampler, WeightedRandomSampler, SubsetRandomSampler, torch's or gpufeed's "
    "DistributedSampler (alone or in a torch BatchSampler), or a sampler or batch_sampler of yours "
    "(not inside another sharding sampler)"
)

# What torch's DistributedSampler's order is a function of (with the epoch), checked on resume.
_TORCH_DISTRIBUTED_KEYS = ("seed", "shuffle", "drop_last", "num_replicas")


@dataclass
class Pass:
    """One pass over the loader: where its index stream began, and what was handed out."""

    sampler_state: dict[str, Any] | None = None  # set at the first index of the pass
    unsupported: str | None = None  # why this pass has no state (the sampler's type)
    lengths: list[int] = field(default_factory=list)  # indices per batch pulled from the stream
    finished: bool = False  # the index stream is exhausted
    yielded: int = 0  # batches the user received (counted by the user-facing iterator)
    count_pulls: bool = True  # yielded == batches pulled (no prefetch between stream and user)
    custom: CustomPosition | None = None  # a sampler of the user's: its start, or its states
    skipped_batches: int = 0  # batches skipped at resume (received before the state was taken)
    skipped_samples: int = 0
    aug_epoch: int = 0
    started: bool = False  # the first index was asked for
    # Past the skipped prefix, batches are numbered 0, 1, ... in the stream's order ("relative
    # numbers"); ``beyond``: those delivered before the state was taken (in_order=False), skipped.
    beyond: frozenset[int] = frozenset()
    beyond_lengths: dict[int, int] = field(default_factory=dict)  # their sizes, seen while skipping
    numbers: list[int] = field(default_factory=list)  # relative number of each batch pulled
    # in_order=False: the pulls of the batches handed out, in the order handed out (FastIter's
    # order_log); None while batches go out in the order they were pulled.
    delivery: list[int] | None = None
    workers: Any = None  # with workers: their states in this pass (gpufeed._resume.positions.WorkerPositions)

    @property
    def batches_received(self) -> int:
        return len(self.lengths) if self.count_pulls else self.yielded

    def position(self) -> tuple[int, int, list[int]]:
        """(batches, samples) of the longest fully received run of batches past the skipped
        prefix, and the relative numbers (from the end of that run) of the batches received
        beyond it."""
        received = self.batches_received
        pulls = self.delivery[:received] if self.delivery is not None else range(received)
        got = {self.numbers[i] for i in pulls} | set(self.beyond)
        run = 0
        while run in got:
            run += 1
        length_of = {r: self.lengths[i] for i, r in enumerate(self.numbers)}
        length_of.update(self.beyond_lengths)
        samples = sum(length_of[r] for r in range(run))
        return run, samples, sorted(r - run for r in got if r > run)

    @property
    def done(self) -> bool:
        return self.finished and self.batches_received >= len(self.lengths)


def base_sampler(index_sampler: Any) -> Any:
    """The per-sample sampler of an index sampler (``BatchSampler.sampler``, also through
    Accelerate's ``BatchSamplerShard``; or itself)."""
    if is_batch_shard(index_sampler):
        index_sampler = index_sampler.batch_sampler
    return index_sampler.sampler if type(index_sampler) is BatchSampler else index_sampler


def is_batch_shard(index_sampler: Any) -> bool:
    """Accelerate's ``BatchSamplerShard`` over a torch ``BatchSampler`` (found by name: gpufeed
    never imports accelerate). Its batches are a fixed function of the inner ones (this rank's
    share), so its position is the inner sampler's state plus the batches taken, for the same
    number of processes (``gpufeed.integrations.accelerate`` records and checks it)."""
    cls = type(index_sampler)
    return (
        cls.__name__ == "BatchSamplerShard"
        and cls.__module__ == "accelerate.data_loader"
        and type(getattr(index_sampler, "batch_sampler", None)) is BatchSampler
    )


# Samplers whose order is one draw from their generator (or, without one, from torch's global RNG)
# at the first index: their position is the generator's state before the draw.
_DRAWING: dict[type, str] = {WeightedRandomSampler: "weighted_random", SubsetRandomSampler: "subset_random"}


def sampler_kind(sampler: Any) -> str | None:
    if isinstance(sampler, DistributedSampler):
        return "gpufeed_distributed"
    if type(sampler) is TorchDistributedSampler:
        return "torch_distributed"
    if type(sampler) is RandomSampler:
        return "random"
    if type(sampler) in _DRAWING:
        return _DRAWING[type(sampler)]
    if type(sampler) is SequentialSampler:
        return "sequential"
    return None


def resolve(index_sampler: Any) -> tuple[str | None, Any]:
    """The kind of position of a loader's index sampler, and the sampler it is the position of:
    a kind of ``sampler_kind``, "stateful" or "custom" (a sampler or batch sampler of the user's,
    ``gpufeed/_resume/sampler_state.py``), or None (no position: a custom sampler inside Accelerate's
    shard, gpufeed's sampler sharded again)."""
    sampler = base_sampler(index_sampler)
    plain = sampler is index_sampler or type(index_sampler) is BatchSampler
    if not plain and not is_batch_shard(index_sampler):
        return custom_kind(index_sampler)  # a batch_sampler of the user's
    kind = sampler_kind(sampler)
    if kind == "gpufeed_distributed" and not plain:
        return None, sampler  # sharded twice: the sampler's position no longer names the batches
    if kind is None and plain:
        return custom_kind(sampler)
    return kind, sampler


class PositionedIndices:
    """A loader's index sampler (``batch_sampler`` or ``sampler``) that records where each pass
    starts and resumes a loaded state. Yields exactly what the wrapped sampler yields.

    ``state``: the loader's ``ResumeState`` (its ``latest`` pass is set here, its loaded state
    taken by ``take_loaded()``), not the loader: the loader's iterator holds this object, and a
    persistent iterator is held by the loader, so a reference back would keep a dropped loader
    (its workers and shared memory) alive until the garbage collector runs."""

    def __init__(self, state: Any, inner: Any, num_workers: int) -> None:
        self._state = state
        self.inner = inner
        self._workers = num_workers > 0
        self.current: Pass | None = None  # the pass of the latest iter()

    def last_number(self) -> int:
        """The number in its pass of the batch pulled last: its place in the pass's order,
        the batches a resumed pass skipped counted (so the same batch has the same number in
        the checkpointed run and the resumed one)."""
        p = self.current
        if p is None or not p.numbers:
            raise RuntimeError("gpufeed: no batch was pulled from this index stream")
        return p.skipped_batches + p.numbers[-1]

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        p = Pass()
        self._state.latest = p
        self.current = p
        return self._stream(p)

    def _stream(self, p: Pass) -> Iterator[Any]:
        # A generator: the body runs at the first index, as RandomSampler draws its seed then
        # (torch's iterator calls iter() twice and drops the first stream unstarted).
        resume = self._state.take_loaded()
        p.started = True
        kind, sampler = resolve(self.inner)
        if kind is None:
            p.unsupported = f"{type(self.inner).__name__} over {type(base_sampler(self.inner)).__name__}"
        loaded = resume["sampler"] if resume is not None else None
        skip = 0
        if resume is not None and loaded is not None and kind is not None:
            skip = _apply_loaded(p, kind, sampler, resume)
        if kind in CUSTOM_KINDS:
            p.custom = CustomPosition(kind, sampler, loaded, workers=self._workers)
            if kind == "stateful":
                skip = 0  # its loaded state is past the received batches (torchdata's protocol)
        restore_generator = _record_start(p, kind, sampler, loaded)
        started = _first_batch(p, self.inner, sampler, skip, restore_generator)
        if started is None:
            p.finished = True
            return
        stream, batch = started
        custom, number = p.custom, 0
        while True:
            if custom is not None:
                custom.after_pull(number, p)
            if number in p.beyond:  # handed out before the state was taken (in_order=False)
                p.beyond_lengths[number] = _length(batch)
            else:
                p.numbers.append(number)
                p.lengths.append(_length(batch))
                yield batch
            number += 1
            try:
                batch = next(stream)
            except StopIteration:
                break
            if custom is not None:
                custom.pulled(batch)
        p.finished = True


def pulled_number(index_sampler: Any, pull: int) -> int:
    """The number in the pass of the batch just pulled from ``index_sampler`` (a loader's
    ``_index_sampler``): ``PositionedIndices.last_number``, or ``pull`` (the pulls counted from
    0) for an index sampler that does not record positions."""
    if isinstance(index_sampler, PositionedIndices):
        return index_sampler.last_number()
    return pull


def _apply_loaded(p: Pass, kind: str, sampler: Any, resume: dict[str, Any]) -> int:
    """Apply a loaded state's sampler part to ``sampler`` and ``p``; the batches to skip."""
    loaded = resume["sampler"]
    skip = 0
    if loaded.get("kind") != kind:
        raise ValueError(
            f"the loaded state was taken with a {loaded.get('kind')!r} sampler; this loader's is "
            f"{kind!r}. Resume with the sampler of the checkpointed run."
        )
    if kind == "gpufeed_distributed":
        sampler.load_state_dict(loaded["state"])  # its position; no batches to skip
    else:
        if kind == "torch_distributed":
            _check_torch_distributed(sampler, loaded)
            sampler.set_epoch(int(loaded["epoch"]))  # the order of the checkpointed epoch
        skip = int(resume["batches_yielded"])
        p.skipped_batches = skip
        p.skipped_samples = int(resume["samples_yielded"])
    p.beyond = frozenset(int(r) for r in resume.get("delivered_beyond", ()))
    return skip


def _record_start(p: Pass, kind: str | None, sampler: Any, loaded: dict[str, Any] | None) -> bool:
    """Record in ``p`` where the pass's order starts (``p.sampler_state``), and with a loaded
    state set a drawing sampler's generator to draw the checkpointed order; whether that
    generator is to be put back to None after the first draw."""
    restore_generator = False
    if kind == "random":
        if loaded is not None:
            if "seed" in loaded:
                drawn = torch.Generator().manual_seed(int(loaded["seed"])).get_state()
            else:
                drawn = _decode(loaded["generator_state"])
            restore_generator = _draw_from(sampler, drawn)
            p.sampler_state = dict(loaded)
        elif sampler.generator is None:
            # Peek at the seed RandomSampler is about to draw from the global RNG (then put
            # the RNG back, so its own draw, and everything after it, is unchanged).
            rng = torch.get_rng_state()
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            torch.set_rng_state(rng)
            p.sampler_state = {"kind": "random", "seed": seed}
        else:
            p.sampler_state = {"kind": "random", "generator_state": _encode(sampler.generator.get_state())}
    elif kind in _DRAWING.values():
        if loaded is not None:
            restore_generator = _draw_from(sampler, _decode(loaded["generator_state"]))
            p.sampler_state = dict(loaded)
        else:
            drawn = torch.get_rng_state() if sampler.generator is None else sampler.generator.get_state()
            p.sampler_state = {"kind": kind, "generator_state": _encode(drawn)}
    elif kind == "sequential":
        p.sampler_state = {"kind": "sequential"}
    elif kind == "gpufeed_distributed":
        # its position is read at state_dict(); the epoch is for next_pass_state()
        p.sampler_state = {"kind": "gpufeed_distributed", "epoch": int(sampler.epoch)}
    elif kind == "torch_distributed":
        p.sampler_state = torch_distributed_state(sampler)
    return restore_generator


def _first_batch(p: Pass, inner: Any, sampler: Any, skip: int,
                 restore_generator: bool) -> tuple[Iterator[Any], Any] | None:
    """Start ``inner``'s stream and pull its first batch past ``skip`` received ones (indices
    only: nothing is fetched or decoded): (stream, batch), or None when the stream ends first."""
    custom = p.custom
    try:
        if custom is not None:
            custom.begin()  # load its state, or record (resumed: set) the RNG states it draws from
        stream = iter(inner)
        try:
            first = next(stream)
        finally:
            if restore_generator:
                sampler.generator = None
        if custom is not None:
            custom.pulled(first)
        for _ in range(skip):
            first = next(stream)
            if custom is not None:
                custom.pulled(first)
    except StopIteration:
        return None
    finally:
        if custom is not None:
            custom.end()  # the process's own global RNG states are back
    return stream, first


def pass_received(p: Pass, index_sampler: Any) -> bool:
    """Every batch of the pass was received (without workers, the index stream learns that it is
    exhausted only at the next pull: a checkpoint after the last batch is an epoch's end)."""
    if p.done:
        return True
    try:
        total = len(index_sampler)
    except TypeError:
        return False
    return p.skipped_batches + len(p.beyond) + p.batches_received >= total


def next_pass_state(index_sampler: Any, p: Pass | None) -> dict[str, Any] | None:
    """Between passes: where the next pass's order comes from (``next_sampler``), or None."""
    kind, sampler = resolve(index_sampler)
    kind = kind or sampler_kind(sampler)  # sharded again: no position within a pass, an epoch still
    if kind in CUSTOM_KINDS:
        last = p.custom.start.get("epoch") if p is not None and p.custom is not None else None
        return _sampler_state.next_pass(sampler, None if last is None else int(last))
    if kind in ("random", *_DRAWING.values()) and sampler.generator is not None:
        return {"kind": kind, "generator_state": _encode(sampler.generator.get_state())}
    if kind in ("torch_distributed", "gpufeed_distributed"):
        last = (p.sampler_state or {}).get("epoch") if p is not None and p.started else None
        return {"kind": kind, "epoch": int(sampler.epoch) if last is None else int(last) + 1}
    return None


def apply_next_pass(index_sampler: Any, state: dict[str, Any]) -> None:
    """Load ``next_sampler``: the next pass draws the order the checkpointed run's next pass drew."""
    kind, sampler = resolve(index_sampler)
    kind = kind or sampler_kind(sampler)
    if state.get("kind") != kind:
        raise ValueError(
            f"the loaded state was taken with a {state.get('kind')!r} sampler; this loader's is "
            f"{kind or type(sampler).__name__!r}. Resume with the sampler of the checkpointed run ({SUPPORTED})."
        )
    if kind == "custom":
        _sampler_state.apply_next(sampler, state)
    elif kind in ("random", *_DRAWING.values()):
        if sampler.generator is not None:
            sampler.generator.set_state(_decode(state["generator_state"]))
    else:
        sampler.set_epoch(int(state["epoch"]))


def torch_distributed_state(sampler: TorchDistributedSampler[Any]) -> dict[str, Any]:
    """What the order of a torch ``DistributedSampler``'s epoch is a function of (besides the rank)."""
    state = {"kind": "torch_distributed", "epoch": int(sampler.epoch),
             "dataset_len": len(sampler.dataset)}  # type: ignore[arg-type]
    for key in _TORCH_DISTRIBUTED_KEYS:
        value = getattr(sampler, key)
        state[key] = value if isinstance(value, bool) else int(value)
    return state


def _check_torch_distributed(sampler: TorchDistributedSampler[Any], loaded: dict[str, Any]) -> None:
    ours = torch_distributed_state(sampler)
    for key in (*_TORCH_DISTRIBUTED_KEYS, "dataset_len"):
        if loaded.get(key) != ours[key]:
            hint = (" torch's DistributedSampler cannot resume on another world size; gpufeed.DistributedSampler "
                    "can." if key == "num_replicas" else "")
            raise ValueError(
                f"the loaded state was taken with a torch DistributedSampler whose `{key}` is "
                f"{loaded.get(key)!r}; this loader's is {ours[key]!r}, so the rest of the epoch would lose or "
                f"repeat samples. Resume with the {key} of the checkpointed run.{hint}"
            )


def _draw_from(sampler: Any, state: torch.Tensor) -> bool:
    """Make ``sampler``'s next draw come from generator ``state``: set into its own generator,
    or into one lent to it (returns True: take it back after the first index)."""
    if sampler.generator is not None:
        sampler.generator.set_state(state)
        return False
    generator = torch.Generator()
    generator.set_state(state)
    sampler.generator = generator
    return True


def _length(batch: Any) -> int:
    try:
        return len(batch)
    except TypeError:
        return 1  # auto-collation off: one index per batch


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
