"""Construction: FastLoader is a DataLoader, takes its arguments, rejects bad ones exactly like it
(same exception type and message), and validates gpufeed's own options before starting anything."""

from __future__ import annotations

import inspect
import multiprocessing

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from gpufeed import FastLoader

from ._datasets import IndexDataset, ShardedIterable, StridedRangeIterable

MAP = IndexDataset(10)
ITER = StridedRangeIterable(0, 10)

BAD_ARGS = {
    "negative num_workers": (MAP, dict(num_workers=-1)),
    "negative timeout": (MAP, dict(timeout=-0.5)),
    "prefetch_factor without workers": (MAP, dict(prefetch_factor=2)),
    "negative prefetch_factor": (MAP, dict(num_workers=1, prefetch_factor=-1)),
    "persistent_workers without workers": (MAP, dict(persistent_workers=True)),
    "sampler and shuffle": (MAP, dict(sampler=SequentialSampler(MAP), shuffle=True)),
    "batch_sampler and batch_size": (MAP, dict(batch_sampler=[[0, 1]], batch_size=2)),
    "batch_sampler and shuffle": (MAP, dict(batch_sampler=[[0, 1]], shuffle=True)),
    "batch_sampler and sampler": (MAP, dict(batch_sampler=[[0, 1]], sampler=[0, 1])),
    "batch_sampler and drop_last": (MAP, dict(batch_sampler=[[0, 1]], drop_last=True)),
    "batch_size None and drop_last": (MAP, dict(batch_size=None, drop_last=True)),
    "iterable and shuffle": (ITER, dict(shuffle=True)),
    "iterable and sampler": (ITER, dict(sampler=[0, 1])),
    "iterable and batch_sampler": (ITER, dict(batch_sampler=[[0, 1]])),
    "unknown start method": (MAP, dict(num_workers=1, multiprocessing_context="teleport")),
    "start method of the wrong type": (MAP, dict(num_workers=1, multiprocessing_context=42)),
    "start method without workers": (MAP, dict(multiprocessing_context="fork")),
    "unknown keyword": (MAP, dict(num_wrokers=2)),
    "too many positional": (MAP, "positional"),
}


def _construct(cls, dataset, kwargs):
    if kwargs == "positional":  # DataLoader's 13 positional parameters after dataset, plus one
        return cls(dataset, 1, False, None, None, 0, None, False, False, 0, None, None, None, 3)
    return cls(dataset, **kwargs)


def _error(cls, dataset, kwargs):
    with pytest.raises(Exception) as info:
        _construct(cls, dataset, kwargs)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_bad_arguments_fail_like_dataloader(case):
    dataset, kwargs = BAD_ARGS[case]
    children = psutil.Process().children(recursive=True)
    want, got = _error(DataLoader, dataset, kwargs), _error(FastLoader, dataset, kwargs)
    assert got == want
    assert psutil.Process().children(recursive=True) == children  # nothing was started


def test_setting_guarded_attributes_fails_like_dataloader():
    for attr, value in [("batch_size", 3), ("sampler", None), ("dataset", MAP), ("persistent_workers", True),
                        ("drop_last", True), ("batch_sampler", None)]:
        errors = []
        for cls in (DataLoader, FastLoader):
            loader = cls(MAP, num_workers=1)
            with pytest.raises(ValueError) as info:
                setattr(loader, attr, value)
            errors.append(str(info.value).replace(cls.__name__, "<Loader>"))
        assert errors[0] == errors[1]


@pytest.mark.parametrize(
    "option, value, exc, message",
    [
        ("max_worker_restarts", -1, ValueError, "`max_worker_restarts` must be >= 0. Found: -1."),
        ("max_worker_restarts", 1.5, TypeError, "`max_worker_restarts` must be an int. Found: 1.5 (float)."),
        ("max_worker_restarts", True, TypeError, "`max_worker_restarts` must be an int. Found: True (bool)."),
        ("max_batch_bytes", 100, ValueError, "`max_batch_bytes` must be >= 65536. Found: 100."),
        ("max_batch_bytes", "1GB", TypeError, "`max_batch_bytes` must be an int. Found: '1GB' (str)."),
        ("shutdown_timeout_s", -1, ValueError, "`shutdown_timeout_s` must be >= 0.0 s. Found: -1."),
        ("shutdown_timeout_s", "2", TypeError, "`shutdown_timeout_s` must be a number of seconds. Found: '2'."),
    ],
)
def test_gpufeed_options_validated_before_anything_starts(option, value, exc, message):
    children = psutil.Process().children(recursive=True)
    with pytest.raises(exc) as info:
        FastLoader(MAP, num_workers=2, **{option: value})
    assert str(info.value) == message
    assert psutil.Process().children(recursive=True) == children


def test_gpufeed_options_are_keyword_only():
    params = inspect.signature(FastLoader).parameters
    for name in ("max_worker_restarts", "max_batch_bytes", "shutdown_timeout_s"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_signature_starts_with_dataloaders():
    ours = list(inspect.signature(FastLoader).parameters.values())
    theirs = list(inspect.signature(DataLoader).parameters.values())
    assert ours[: len(theirs)] == theirs


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(batch_size=3),
        dict(batch_size=3, drop_last=True),
        dict(batch_size=4, shuffle=True),
        dict(batch_size=None),
        dict(batch_sampler=[[0], [1, 2], [3, 4, 5]]),
        dict(sampler=[1, 2, 3, 4, 5], batch_size=2),
        dict(num_workers=2, batch_size=3, prefetch_factor=4, persistent_workers=True),
        dict(num_workers=1, multiprocessing_context="spawn"),
        dict(num_workers=1, multiprocessing_context=multiprocessing.get_context("forkserver")),
    ],
)
def test_attributes_and_len_equal_to_dataloader(kwargs):
    ours, theirs = FastLoader(MAP, **kwargs), DataLoader(MAP, **kwargs)
    assert isinstance(ours, DataLoader)
    assert len(ours) == len(theirs)
    for attr in ("batch_size", "drop_last", "num_workers", "prefetch_factor", "persistent_workers", "timeout",
                 "in_order", "pin_memory", "collate_fn", "worker_init_fn", "generator"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)
    ctx_ours, ctx_theirs = ours.multiprocessing_context, theirs.multiprocessing_context
    assert (ctx_ours is None and ctx_theirs is None) or ctx_ours.get_start_method() == ctx_theirs.get_start_method()


@pytest.mark.parametrize("batch_size, drop_last", [(None, False), (3, False), (3, True), (1, False)])
def test_len_of_iterable_dataset_loader(batch_size, drop_last):
    ds = ShardedIterable((4, 3))
    ours = FastLoader(ds, batch_size=batch_size, drop_last=drop_last, num_workers=2)
    theirs = DataLoader(ds, batch_size=batch_size, drop_last=drop_last, num_workers=2)
    assert len(ours) == len(theirs)


def test_len_of_iterable_without_len_raises_like_dataloader():
    from torch.utils.data import IterableDataset

    class NoLen(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    errors = []
    for cls in (DataLoader, FastLoader):
        with pytest.raises(TypeError) as info:
            len(cls(NoLen(), batch_size=2, num_workers=1))
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_generator_none_uses_global_rng_like_dataloader():
    torch.manual_seed(0)
    a = FastLoader(MAP, shuffle=True, batch_size=None)
    assert a.generator is None and DataLoader(MAP, shuffle=True).generator is None
