"""Worker set-up and iterable datasets: worker_init_fn, get_worker_info(), seeds, IterableDataset
sharding and exhaustion, start methods."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from ._datasets import (
    RandomDataset,
    RecordWorkerInit,
    ShardedIterable,
    SlowDataset,
    StridedRangeIterable,
    WorkerInfoDataset,
    tag_worker,
)
from ._parity import check_parity, first_error, make_pair, run_epochs

pytestmark = pytest.mark.timeout(60)


# -- worker set-up ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("init", [None, tag_worker])
def test_get_worker_info_inside_getitem(num_workers, init):
    (batches,) = check_parity(WorkerInfoDataset(12), num_workers=num_workers, batch_size=2, shuffle=True,
                              worker_init_fn=init, seed=3)
    ids = {int(w) for b in batches for w in b["id"]}
    assert ids == set(range(num_workers))
    assert all(b["num_workers"].eq(num_workers).all() for b in batches)
    assert all(b["num_threads"].eq(1).all() for b in batches)
    if init is not None:
        assert all(b["init_tag"].eq(1000 + b["id"]).all() for b in batches)
        assert all(b["init_seed"].eq(b["seed"]).all() for b in batches)


def test_worker_seed_follows_generator_not_global_rng():
    # With no generator the base seed comes from torch's global RNG: same global seed, same seeds.
    from torch.utils.data import DataLoader

    from gpufeed import FastLoader

    got = []
    for cls in (FastLoader, DataLoader):
        torch.manual_seed(1234)
        loader = cls(WorkerInfoDataset(6), num_workers=2, batch_size=3)
        got.append(run_epochs(loader, 2))
        got.append(torch.rand(2).tolist())  # the global RNG advanced alike
    from ._parity import assert_same_batches

    for e in range(2):
        assert_same_batches(got[0][e], got[2][e])
    assert got[1] == got[3]


def test_worker_init_fn_sees_the_same_worker_state(tmp_path):
    seen = {}
    for name, loader in zip(("ours", "theirs"), make_pair(RandomDataset(8), num_workers=2, batch_size=2,
                                                          worker_init_fn=RecordWorkerInit(str(tmp_path)), seed=17)):
        for f in tmp_path.iterdir():
            f.unlink()
        run_epochs(loader, 2)
        seen[name] = sorted(f.read_text() for f in tmp_path.iterdir())
    assert len(seen["theirs"]) == 4  # 2 workers x 2 epochs (non-persistent)
    assert seen["ours"] == seen["theirs"]


def test_worker_init_fn_runs_once_with_persistent_workers(tmp_path):
    seen = {}
    for name, loader in zip(("ours", "theirs"), make_pair(RandomDataset(8), num_workers=2, batch_size=2,
                                                          worker_init_fn=RecordWorkerInit(str(tmp_path)),
                                                          persistent_workers=True)):
        for f in tmp_path.iterdir():
            f.unlink()
        run_epochs(loader, 3)
        seen[name] = sorted(f.read_text() for f in tmp_path.iterdir())
    assert len(seen["theirs"]) == 2
    assert seen["ours"] == seen["theirs"]


def test_worker_init_fn_error_has_the_same_type():
    ours, theirs = make_pair(RandomDataset(4), num_workers=1, batch_size=2, worker_init_fn=_fail_init)
    want, got = first_error(theirs), first_error(ours)
    assert got[0] is want[0] is KeyError
    assert "no such key" in got[1] and "no such key" in want[1]


def _fail_init(worker_id):
    raise KeyError("no such key")


# -- IterableDataset -----------------------------------------------------------------------------
# Most of these pass a generous loader `timeout`: it changes no batch, and an engine that loses a
# worker's end-of-data message fails fast with a timeout error instead of hanging the suite.
ITER_TIMEOUT_S = 5.0


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("batch_size", [1, 3, None])
def test_iterable_strided_sharding_exact_order(num_workers, batch_size):
    (batches,) = check_parity(StridedRangeIterable(0, 20), num_workers=num_workers, batch_size=batch_size,
                              timeout=ITER_TIMEOUT_S)
    firsts = [b[0] if batch_size is None else int(b[0][0]) for b in batches]
    assert firsts[0] == 0


@pytest.mark.parametrize("lengths", [(6, 6), (5, 5)])
def test_iterable_equal_shards_exact_order(lengths):
    check_parity(ShardedIterable(lengths), num_workers=2, batch_size=2, timeout=ITER_TIMEOUT_S)


@pytest.mark.parametrize("lengths", [(3, 11), (11, 3), (0, 7), (7, 0), (0, 0), (1, 1)])
@pytest.mark.parametrize("batch_size", [2, None])
def test_iterable_workers_end_at_different_times_in_order(lengths, batch_size):
    # With in_order=True the order is fixed by torch's policy: round robin until a worker reports
    # its end, then the other workers only.
    (batches,) = check_parity(ShardedIterable(lengths), num_workers=2, batch_size=batch_size,
                              timeout=ITER_TIMEOUT_S)
    n = sum(lengths)
    assert sum(1 if batch_size is None else len(b["j"]) for b in batches) == n


@pytest.mark.parametrize("lengths", [(3, 11), (0, 7)])
def test_iterable_workers_end_at_different_times_any_order(lengths):
    check_parity(ShardedIterable(lengths), num_workers=2, batch_size=2, in_order=False,
                 timeout=ITER_TIMEOUT_S)


@pytest.mark.parametrize("lengths", [(7, 5), (2, 9), (3, 3)])
def test_iterable_drop_last(lengths):
    # drop_last drops each worker's partial batch
    (batches,) = check_parity(ShardedIterable(lengths), num_workers=2, batch_size=3, drop_last=True,
                              timeout=ITER_TIMEOUT_S)
    assert all(len(b["j"]) == 3 for b in batches)


@pytest.mark.parametrize("prefetch_factor", [1, 4])
def test_iterable_prefetch_factor(prefetch_factor):
    check_parity(ShardedIterable((4, 9)), num_workers=2, batch_size=2, prefetch_factor=prefetch_factor,
                 timeout=ITER_TIMEOUT_S)


def test_iterable_persistent_workers():
    check_parity(ShardedIterable((4, 7)), num_workers=2, batch_size=3, persistent_workers=True, epochs=3,
                 timeout=ITER_TIMEOUT_S)


def test_iterable_abandoned_epoch_then_full_epoch():
    from ._parity import assert_same_batches, close

    results = []
    for loader in make_pair(ShardedIterable((5, 8)), num_workers=2, batch_size=2, persistent_workers=True,
                            timeout=ITER_TIMEOUT_S):
        try:
            it = iter(loader)
            first = [next(it)]
            results.append((first, list(loader), list(loader)))
        finally:
            close(loader)
    for a, b in zip(*results):
        assert_same_batches(a, b)


def test_iterable_timeout_and_sample_kinds():
    check_parity(ShardedIterable((3, 4), kind="nested"), num_workers=2, batch_size=2, timeout=10)


@pytest.mark.timeout(30)
def test_iterable_single_worker_no_timeout():
    # the default timeout=0: a worker that never reports its end blocks forever
    check_parity(ShardedIterable((9,), kind="tensor_bf16"), num_workers=1, batch_size=4)


# -- start methods ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods(method):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    # spawn as a context object, the others by name (DataLoader accepts both)
    context = multiprocessing.get_context("spawn") if method == "spawn" else method
    persistent = method == "spawn"  # persistent workers over 2 epochs: test_persistent_* cover fork
    check_parity(WorkerInfoDataset(8), num_workers=2, batch_size=3, shuffle=True, worker_init_fn=tag_worker,
                 multiprocessing_context=context, persistent_workers=persistent, epochs=2 if persistent else 1)


def test_forkserver_iterable():
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("forkserver is not available on this platform")
    check_parity(ShardedIterable((2, 5)), num_workers=2, batch_size=2, multiprocessing_context="forkserver",
                 timeout=30)


def test_forkserver_workers_live_through_a_long_epoch():
    # a forkserver worker's parent process is the fork server, not the loader's process
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("forkserver is not available on this platform")
    check_parity(SlowDataset(8, 0.15), num_workers=1, batch_size=2, multiprocessing_context="forkserver")
