"""Datasets, samplers, collate functions and worker_init_fns of the parity tests.

Everything here is module level, so "spawn" and "forkserver" workers can unpickle it. Every
sample is a pure function of its index (or of the worker's seeded random state), so the same
seed gives the same batches under torch's DataLoader and under FastLoader.
"""

from __future__ import annotations

import os
import random
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

Point = namedtuple("Point", ["x", "y"])


# -- samples of every kind default_collate knows (and a few it passes through) -------------------


def make_sample(kind: str, i: int) -> Any:
    """A deterministic sample of ``kind`` for index ``i``."""
    if kind == "tensor_f32":
        return torch.arange(6, dtype=torch.float32).view(2, 3) * 0.5 + i
    if kind == "tensor_f64":
        return torch.linspace(0, 1, 5, dtype=torch.float64) + i
    if kind == "tensor_f16":
        return (torch.arange(4, dtype=torch.float16) + i) / 8
    if kind == "tensor_bf16":
        return (torch.arange(4, dtype=torch.bfloat16) + i) / 4
    if kind == "tensor_bool":
        return torch.tensor([i % 2 == 0, i % 3 == 0, True, False])
    if kind == "tensor_int8":
        return torch.tensor([i, -i, 127, -128], dtype=torch.int8)
    if kind == "tensor_uint8":
        return torch.full((2, 2), i % 256, dtype=torch.uint8)
    if kind == "tensor_int64":
        return torch.tensor([i, 2**40 + i], dtype=torch.int64)
    if kind == "tensor_complex64":
        return torch.tensor([i + 1j, -i - 2j], dtype=torch.complex64)
    if kind == "tensor_0d":
        return torch.tensor(float(i))
    if kind == "tensor_transposed":  # non-contiguous sample
        return (torch.arange(12, dtype=torch.float32).view(3, 4) + i).t()
    if kind == "tensor_strided":  # non-contiguous slice with a storage offset
        return (torch.arange(20, dtype=torch.int32) * (i + 1))[3::4]
    if kind == "tensor_expanded":  # stride 0
        return torch.tensor([float(i)]).expand(3)
    if kind == "tensor_empty":
        return torch.zeros(0, 3)
    if kind == "ndarray_f64":
        return np.arange(6, dtype=np.float64).reshape(2, 3) / 3 + i
    if kind == "ndarray_f16":
        return (np.arange(4, dtype=np.float16) + i) / 8
    if kind == "ndarray_bool":
        return np.array([i % 2 == 0, True, False])
    if kind == "ndarray_int8":
        return np.array([i, -i, -128, 127], dtype=np.int8)
    if kind == "ndarray_uint16":
        return np.array([i, 65535], dtype=np.uint16)
    if kind == "ndarray_transposed":
        return (np.arange(12, dtype=np.float32).reshape(3, 4) + i).T
    if kind == "ndarray_reversed":  # negative stride
        return (np.arange(5, dtype=np.int64) + i)[::-1]
    if kind == "ndarray_empty":
        return np.zeros((0, 2), dtype=np.float32)
    if kind == "np_scalar":
        return np.float32(i) / 3
    if kind == "int":
        return i * 7 - 3
    if kind == "float":
        return i / 3
    if kind == "bool":
        return i % 2 == 0
    if kind == "str":
        return f"sample-{i}-é"
    if kind == "bytes":
        return bytes([i % 256, 0, 255]) * 2
    if kind == "dict":
        return {"img": torch.full((2,), float(i)), "label": i, "name": f"n{i}"}
    if kind == "tuple":
        return (torch.tensor([i, i + 1]), i, f"t{i}")
    if kind == "list":
        return [torch.tensor(float(i)), np.array([i, i], dtype=np.int16)]
    if kind == "namedtuple":
        return Point(torch.tensor([i]), float(i))
    if kind == "nested":
        return {
            "a": (torch.ones(2, 2, dtype=torch.float16) * i, [i, {"b": np.array([i], dtype=np.int8)}]),
            "p": Point(x=torch.tensor([i, -i]), y={"s": str(i), "by": bytes([i % 256])}),
            "z": torch.zeros(0),
        }
    raise ValueError(f"unknown sample kind {kind!r}")


# default_collate accepts these (the others are exercised with identity collate / batch_size=None)
COLLATABLE_KINDS = [
    "tensor_f32",
    "tensor_f64",
    "tensor_f16",
    "tensor_bf16",
    "tensor_bool",
    "tensor_int8",
    "tensor_uint8",
    "tensor_int64",
    "tensor_complex64",
    "tensor_0d",
    "tensor_transposed",
    "tensor_strided",
    "tensor_expanded",
    "tensor_empty",
    "ndarray_f64",
    "ndarray_f16",
    "ndarray_bool",
    "ndarray_int8",
    "ndarray_uint16",
    "ndarray_transposed",
    "ndarray_empty",
    "np_scalar",
    "int",
    "float",
    "bool",
    "str",
    "bytes",
    "dict",
    "tuple",
    "list",
    "namedtuple",
    "nested",
]
ALL_KINDS = COLLATABLE_KINDS + ["ndarray_reversed"]


class SampleDataset(Dataset):
    """``n`` samples of one kind (see ``make_sample``)."""

    def __init__(self, n: int = 11, kind: str = "tensor_f32") -> None:
        self.n, self.kind = n, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return make_sample(self.kind, i)


class IndexDataset(Dataset):
    """Sample ``i`` is ``(i, tensor of 2 rows)``: batches show exactly which indices they hold."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return i, torch.tensor([[i, i * i], [-i, 7]], dtype=torch.float32)


class NoneDataset(Dataset):
    """Samples holding None (default_collate refuses them; default_convert passes them through)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return {"x": torch.tensor([i]), "missing": None, "pair": (None, i)}


class RandomDataset(Dataset):
    """Each sample draws from ``random``, ``torch`` and ``numpy``: it depends on the worker's seed
    and on how many samples that worker drew before."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return {
            "i": i,
            "py": random.random(),
            "bits": random.getrandbits(31),
            "torch": torch.rand(3),
            "randint": torch.randint(0, 1000, (2,)),
            "np": np.random.rand(2),
            "np_int": np.random.randint(0, 1 << 30),
        }


class WorkerInfoDataset(Dataset):
    """Returns what ``get_worker_info()`` and the seeded generators say inside ``__getitem__``."""

    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        assert info is not None, "get_worker_info() is None inside a worker"
        return {
            "i": i,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "initial_seed": torch.initial_seed(),
            "same_dataset_type": type(info.dataset) is type(self),
            "dataset_n": info.dataset.n,
            "init_tag": INIT_STATE.get("tag", -1),
            "init_seed": INIT_STATE.get("seed", -1),
            "num_threads": torch.get_num_threads(),
            "draws": (random.random(), torch.rand(1), np.random.rand()),
        }


class ShardedIterable(IterableDataset):
    """Worker ``k`` yields ``lengths[k]`` items tagged with its id (``sum(lengths)`` in-process)."""

    def __init__(self, lengths: tuple[int, ...], kind: str = "tensor_f32") -> None:
        self.lengths, self.kind = tuple(lengths), kind

    def __len__(self) -> int:
        return sum(self.lengths)

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            for w, n in enumerate(self.lengths):
                yield from (self._item(w, j) for j in range(n))
            return
        assert info.num_workers == len(self.lengths), (info.num_workers, self.lengths)
        for j in range(self.lengths[info.id]):
            yield self._item(info.id, j)

    def _item(self, w: int, j: int) -> Any:
        return {"worker": w, "j": j, "x": make_sample(self.kind, 100 * w + j), "r": random.random()}


class StridedRangeIterable(IterableDataset):
    """The textbook sharding: ``range(start, end)`` split by ``worker_id::num_workers``."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self):
        info = get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(self.start + first, self.end, step):
            yield i, torch.tensor([i, -i], dtype=torch.int16), np.array([i / 2])


# -- samplers ----------------------------------------------------------------------------------


class EveryOtherReversedSampler(Sampler[int]):
    """A custom sampler: odd indices descending, then even indices ascending, some repeated."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        yield from range(self.n - 1 if self.n % 2 == 0 else self.n - 2, 0, -2)
        yield from range(0, self.n, 2)
        yield from (1, 1, 0)

    def __len__(self) -> int:
        return len(range(1, self.n, 2)) + len(range(0, self.n, 2)) + 3


class VariableBatchSampler(Sampler[list[int]]):
    """A custom batch_sampler: batches of sizes 1, 2, 3, ... (shuffled with its own generator)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed)).tolist()
        size, start = 1, 0
        while start < self.n:
            yield order[start : start + size]
            start += size
            size += 1

    def __len__(self) -> int:
        size, start, count = 1, 0, 0
        while start < self.n:
            start += size
            size += 1
            count += 1
        return count


# -- collate functions -------------------------------------------------------------------------


@dataclass
class CustomBatch:
    """A user's batch type: tensors, a list of tensors, plain metadata."""

    images: torch.Tensor
    per_sample: list
    indices: list
    note: str


def collate_identity(batch: list) -> list:
    return batch


def collate_custom_object(batch: list) -> CustomBatch:
    idx = [b[0] for b in batch]
    tensors = [b[1] for b in batch]
    return CustomBatch(torch.stack(tensors), tensors, idx, f"{len(batch)} samples")


def collate_list_of_tensors(batch: list) -> list:
    """Unstacked per-sample tensors plus a fresh one (no default_collate)."""
    return [b[1].clone() for b in batch] + [torch.tensor([b[0] for b in batch])]


def collate_views(batch: list) -> dict:
    """Tensors that are views of one another (one made by default_collate, one by torch.stack)."""
    from torch.utils.data import default_collate

    collated = default_collate([b[1] for b in batch])  # under gpufeed: written into the slot
    stacked = torch.stack([b[1] for b in batch]) + 0  # an ordinary tensor
    return {
        "collated": collated,
        "collated_row": collated[-1],
        "collated_t": collated.transpose(0, 2),
        "stacked": stacked,
        "stacked_tail": stacked[1:],
        "stacked_col": stacked[:, :, 1],
        "stacked_flat": stacked.view(-1),
    }


def collate_noncontiguous(batch: list) -> tuple:
    base = torch.stack([b[1] for b in batch])  # (B, 2, 2)
    return (
        base.permute(2, 0, 1),
        base[:, 1, :],
        base[::2],
        torch.arange(12.0).view(3, 4)[:, 1:3],
        torch.tensor([float(len(batch))]).expand(4, 3),
        np.asfortranarray(np.arange(6).reshape(2, 3)),
        np.arange(10)[::-3],
    )


def collate_zero_size(batch: list) -> dict:
    n = len(batch)
    return {
        "empty": torch.empty(0),
        "empty_2d": torch.zeros(n, 0, 3, dtype=torch.float16),
        "empty_np": np.zeros((0, n), dtype=np.int32),
        "scalar": torch.tensor(n),
        "nonempty": torch.tensor([b[0] for b in batch]),
        "empty_view": torch.arange(6.0)[6:],
    }


def collate_keep_none(batch: list) -> dict:
    from torch.utils.data import default_collate

    return {"x": default_collate([b["x"] for b in batch]), "missing": [b["missing"] for b in batch]}


# -- worker_init_fn ----------------------------------------------------------------------------

INIT_STATE: dict[str, int] = {}


def tag_worker(worker_id: int) -> None:
    """A worker_init_fn whose effect shows up in the data (WorkerInfoDataset reads it)."""
    INIT_STATE["tag"] = 1000 + worker_id
    INIT_STATE["seed"] = torch.utils.data.get_worker_info().seed


class RecordWorkerInit:
    """A picklable worker_init_fn that writes what it sees into ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        line = (
            f"{worker_id} {info.id} {info.num_workers} {info.seed} {torch.initial_seed()} "
            f"{random.random()!r} {np.random.randint(1 << 30)} {torch.rand(1).item()!r}"
        )
        path = os.path.join(self.directory, f"worker-{worker_id}-{os.getpid()}")
        with open(path, "w") as f:
            f.write(line)


class AllKindsDataset(Dataset):
    """Sample ``i`` is a dict holding one sample of every kind in ``kinds``."""

    def __init__(self, n: int = 7, kinds: tuple[str, ...] = tuple(ALL_KINDS)) -> None:
        self.n, self.kinds = n, tuple(kinds)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return {kind: make_sample(kind, i) for kind in self.kinds}


class SlowDataset(IndexDataset):
    """IndexDataset whose samples take ``delay_s`` each: an epoch lasts a while."""

    def __init__(self, n: int, delay_s: float) -> None:
        super().__init__(n)
        self.delay_s = delay_s

    def __getitem__(self, i: int) -> Any:
        import time

        time.sleep(self.delay_s)
        return super().__getitem__(i)
