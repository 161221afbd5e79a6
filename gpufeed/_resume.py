"""A loader's mid-epoch position (DESIGN decision 13: position, not history).

The state of a pass is where its index stream started and how many batches the user received:
resuming rebuilds the same index stream and skips that many batches of *indices* (no fetch, no
decode); the image path's augmentation is keyed by ``(seed, epoch, index)``, so the rest of the
epoch is byte-identical. ``gpufeed.DistributedSampler`` keeps its own world-size-independent
position instead (``state_dict(samples_per_rank=k)``), so its ranks may change on resume.

State, version 1 (a JSON-serialisable dict)::

    version          1
    epoch            augmentation epoch of the pass (the next pass, if none is in progress)
    batches_yielded  batches the user received in that pass
    samples_yielded  sample indices in those batches
    image_seed       the image path's augmentation seed, else None
    sampler          None (no pass in progress: the next iter() starts a fresh epoch), or
                     {"kind": "sequential"}
                     {"kind": "random", "seed": int}  (RandomSampler without a generator: the seed
                         it drew from torch's global RNG)
                     {"kind": "random", "generator_state": base64}  (the state of its generator
                         before the epoch's draw)
                     {"kind": "gpufeed_distributed", "state": DistributedSampler.state_dict(...)}
    dataset          IterableDataset only: its own ``state_dict()``
    accelerate       gpufeed.integrations.accelerate's loaders only: {"num_processes", "sharded_by",
                     "iteration"} (Accelerate's sharding: resume on the same number of processes)
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

STATE_VERSION = 1

SUPPORTED = "SequentialSampler, RandomSampler or gpufeed.DistributedSampler (alone or in a torch BatchSampler)"


@dataclass
class Pass:
    """One pass over the loader: where its index stream began, and what was handed out."""

    sampler_state: dict[str, Any] | None = None  # set at the first index of the pass
    unsupported: str | None = None  # why this pass has no state (the sampler's type)
    lengths: list[int] = field(default_factory=list)  # indices per batch pulled from the stream
    finished: bool = False  # the index stream is exhausted
    yielded: int = 0  # batches the user received (counted by the user-facing iterator)
    count_pulls: bool = True  # yielded == batches pulled (no prefetch between stream and user)
    skipped_batches: int = 0  # batches skipped at resume (received before the state was taken)
    skipped_samples: int = 0
    aug_epoch: int = 0
    started: bool = False  # the first index was asked for

    @property
    def batches_received(self) -> int:
        return len(self.lengths) if self.count_pulls else self.yielded

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


def sampler_kind(sampler: Any) -> str | None:
    from gpufeed.sampler import DistributedSampler

    if isinstance(sampler, DistributedSampler):
        return "gpufeed_distributed"
    if type(sampler) is RandomSampler:
        return "random"
    if type(sampler) is SequentialSampler:
        return "sequential"
    return None


class PositionedIndices:
    """A loader's index sampler (``batch_sampler`` or ``sampler``) that records where each pass
    starts and resumes a loaded state. Yields exactly what the wrapped sampler yields."""

    def __init__(self, loader: Any, inner: Any) -> None:
        self._loader = loader
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        p = Pass()
        self._loader._pass = p
        return self._stream(p)

    def _stream(self, p: Pass) -> Iterator[Any]:
        # A generator: the body runs at the first index, as RandomSampler draws its seed then
        # (torch's iterator calls iter() twice and drops the first stream unstarted).
        resume = self._loader._take_resume()
        p.started = True
        sampler = base_sampler(self.inner)
        plain = sampler is self.inner or type(self.inner) is BatchSampler
        kind = sampler_kind(sampler) if plain or is_batch_shard(self.inner) else None
        if kind == "gpufeed_distributed" and not plain:
            kind = None  # sharded twice: the sampler's position no longer names the batches
        if kind is None:
            p.unsupported = f"{type(self.inner).__name__} over {type(sampler).__name__}"
        loaded = resume["sampler"] if resume is not None else None
        skip = 0
        if loaded is not None and kind is not None:
            if loaded.get("kind") != kind:
                raise ValueError(
                    f"the loaded state was taken with a {loaded.get('kind')!r} sampler; this loader's is "
                    f"{kind!r}. Resume with the sampler of the checkpointed run."
                )
            if kind == "gpufeed_distributed":
                sampler.load_state_dict(loaded["state"])  # its position; no batches to skip
            else:
                skip = int(resume["batches_yielded"])
                p.skipped_batches = skip
                p.skipped_samples = int(resume["samples_yielded"])
        restore_generator = False
        if kind == "random":
            if loaded is not None:
                generator = torch.Generator()
                if "seed" in loaded:
                    generator.manual_seed(int(loaded["seed"]))
                else:
                    generator.set_state(_decode(loaded["generator_state"]))
                if sampler.generator is None:
                    sampler.generator, restore_generator = generator, True
                else:
                    sampler.generator.set_state(generator.get_state())
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
        elif kind == "sequential":
            p.sampler_state = {"kind": "sequential"}
        elif kind == "gpufeed_distributed":
            p.sampler_state = {"kind": "gpufeed_distributed"}  # its state is read at state_dict()
        stream = iter(self.inner)
        try:
            try:
                first = next(stream)
            finally:
                if restore_generator:
                    sampler.generator = None
            for _ in range(skip):  # indices only: nothing is fetched or decoded
                first = next(stream)
        except StopIteration:
            p.finished = True
            return
        p.lengths.append(_length(first))
        yield first
        for batch in stream:
            p.lengths.append(_length(batch))
            yield batch
        p.finished = True


def _length(batch: Any) -> int:
    try:
        return len(batch)
    except TypeError:
        return 1  # auto-collation off: one index per batch


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
