"""Run torch's DataLoader and FastLoader on the same arguments and seed; compare exactly."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from gpufeed import FastLoader


def assert_same(ours: Any, theirs: Any, path: str = "batch") -> None:
    """Exact equality of two batches: container types and order, dtypes, shapes, strides, values."""
    assert type(ours) is type(theirs), f"{path}: FastLoader gave {type(ours)}, DataLoader {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        assert ours.stride() == theirs.stride(), f"{path}: stride {ours.stride()} != {theirs.stride()}"
        assert ours.device == theirs.device, f"{path}: device {ours.device} != {theirs.device}"
        assert ours.requires_grad == theirs.requires_grad, f"{path}: requires_grad differs"
        assert torch.equal(ours, theirs), f"{path}: values differ\n{ours}\n!=\n{theirs}"
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: shape {ours.shape} != {theirs.shape}"
        assert np.array_equal(ours, theirs), f"{path}: values differ\n{ours}\n!=\n{theirs}"
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for k in theirs:
            assert_same(ours[k], theirs[k], f"{path}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), f"{path}: length {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, float):
        assert ours == theirs or (math.isnan(ours) and math.isnan(theirs)), f"{path}: {ours!r} != {theirs!r}"
    elif isinstance(theirs, (int, str, bytes, bool, type(None), np.generic)):
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"
    elif hasattr(theirs, "__dict__"):
        assert_same(vars(ours), vars(theirs), f"{path}.__dict__")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def assert_same_batches(ours: list, theirs: list, what: str = "epoch") -> None:
    assert len(ours) == len(theirs), f"{what}: FastLoader gave {len(ours)} batches, DataLoader {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b, f"{what} batch {i}")


def fingerprint(obj: Any) -> Any:
    """A hashable, exact rendering of a batch (for comparing multisets of batches)."""
    if isinstance(obj, torch.Tensor):
        raw = obj.contiguous().view(-1).view(torch.uint8) if obj.numel() else torch.empty(0)
        return ("T", str(obj.dtype), tuple(obj.shape), raw.numpy().tobytes())
    if isinstance(obj, np.ndarray):
        return ("N", str(obj.dtype), obj.shape, np.ascontiguousarray(obj).tobytes())
    if isinstance(obj, dict):
        return ("D", tuple((k, fingerprint(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(fingerprint(v) for v in obj))
    return (type(obj).__name__, repr(obj))


def assert_same_multiset(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    assert Counter(map(fingerprint, ours)) == Counter(map(fingerprint, theirs))


def make_pair(dataset: Any, seed: int = 0, **kwargs: Any) -> tuple[FastLoader, DataLoader]:
    """The same loader twice: FastLoader and DataLoader, each with its own generator seeded ``seed``."""
    ours = FastLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    theirs = DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    assert isinstance(ours, DataLoader)
    return ours, theirs


def run_epochs(loader: DataLoader, epochs: int) -> list[list]:
    try:
        return [list(loader) for _ in range(epochs)]
    finally:
        close(loader)


def first_error(loader: DataLoader) -> tuple[type, str, BaseException]:
    """(type, message, exception) of what the loader's first batch raises; stops its workers."""
    it = iter(loader)
    try:
        next(it)
    except Exception as exc:
        return type(exc), str(exc), exc
    else:
        raise AssertionError(f"{type(loader).__name__}: the first batch raised nothing")
    finally:
        _close_iterator(it)


def _close_iterator(it) -> None:
    if hasattr(it, "close"):  # gpufeed's
        it.close()
    elif hasattr(it, "_shutdown_workers"):  # torch's; its __del__ alone may wait seconds
        it._shutdown_workers()


def close(loader: DataLoader) -> None:
    if isinstance(loader, FastLoader):
        loader.close()
    else:
        it = loader._iterator
        loader._iterator = None
        if it is not None:
            _close_iterator(it)


def check_parity(dataset: Any, *, epochs: int = 1, seed: int = 0, in_order: bool = True, **kwargs: Any) -> list:
    """Every batch of every epoch equal (in order, or as a multiset when ``in_order=False``), same
    ``len(loader)``, and the generators consumed alike. Returns FastLoader's batches per epoch."""
    ours, theirs = make_pair(dataset, seed=seed, in_order=in_order, **kwargs)
    if _has_len(dataset):
        assert len(ours) == len(theirs)
    got, want = run_epochs(ours, epochs), run_epochs(theirs, epochs)
    for e, (g, w) in enumerate(zip(got, want)):
        if in_order:
            assert_same_batches(g, w, f"epoch {e}")
        else:
            assert_same_multiset(g, w)
        if _has_len(dataset) and _finite(ours):
            assert len(g) == len(ours), "len(loader) must count the batches of an epoch"
    assert torch.equal(ours.generator.get_state(), theirs.generator.get_state()), "generator consumed differently"
    return got


def _has_len(dataset: Any) -> bool:
    try:
        len(dataset)
    except TypeError:
        return False
    return True


def _finite(loader: DataLoader) -> bool:
    return not isinstance(loader.dataset, torch.utils.data.IterableDataset)
