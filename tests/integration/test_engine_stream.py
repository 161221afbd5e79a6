"""The engine driven directly by a stream of tasks: no sampler, no DataLoader, no FastIter.

This is how a producer other than a DataLoader (an inference batcher) uses the workers and the
arena: ``submit`` requests, take replies in arrival order, hand out their batches.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch

from gpufeed._engine.context import EngineContext
from gpufeed._engine.engine import Engine, TaskRecord
from gpufeed._engine.messages import Done, Failed
from gpufeed._engine.worker import WorkerSpec
from gpufeed.config import EngineConfig
from gpufeed.serve._clock import ManualClock
from gpufeed.stats import Stats

SAMPLE_S = 0.15  # per request: long enough for a killed worker to owe queued tasks


class Requests(torch.utils.data.Dataset):
    """Request i -> tensor([i, pid of the worker that ran it]); every run leaves a marker file."""

    def __init__(self, runs_dir: str) -> None:
        self.runs_dir = runs_dir

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> torch.Tensor:
        # "x": a second run of the same request in the same process fails the task
        with open(os.path.join(self.runs_dir, f"{i}.{os.getpid()}"), "x"):
            pass
        time.sleep(SAMPLE_S)
        return torch.tensor([i, os.getpid()], dtype=torch.int64)


def _runs(runs_dir: str) -> dict[int, list[int]]:
    """Request -> pids that started running it."""
    out: dict[int, list[int]] = {}
    for name in os.listdir(runs_dir):
        request, pid = name.split(".")
        out.setdefault(int(request), []).append(int(pid))
    return out


@pytest.mark.timeout(60)
def test_a_task_stream_survives_a_sigkill_and_shuts_down_clean(tmp_path):
    context = EngineContext(EngineConfig(max_batch_bytes=1 << 16), Stats())
    engine = Engine(context, WorkerSpec(dataset=Requests(str(tmp_path))), num_workers=2)
    first_pids = list(engine.pids)
    num_requests = 12
    records: dict[int, TaskRecord] = {}
    results: dict[int, list[int]] = {}
    killed = None
    try:
        for request in range(num_requests):  # the engine picks the worker that owes fewest
            record = engine.submit([request])
            records[record.idx] = record
        assert {r.worker_id for r in records.values()} == {0, 1}
        while len(results) < num_requests:
            for record, reply in engine.wait(timeout_s=30.0):
                assert not isinstance(reply, Failed), reply.error.traceback
                assert isinstance(reply, Done)
                assert record.idx not in results, "a task was answered twice"
                batch = engine.result(record, reply)
                results[record.idx] = batch[0].tolist()
                del batch
            if killed is None:  # after the first reply, worker 0 still owes queued tasks
                assert engine.owed(0) >= 2
                killed = engine.pid(0)
                os.kill(killed, signal.SIGKILL)
        assert engine.restarts == 1
        replacement = engine.pid(0)
        assert replacement not in first_pids
        all_pids = [*first_pids, replacement]
    finally:
        engine.close()

    # Every request's batch arrived once, with its own data.
    assert sorted(results) == list(range(num_requests))
    assert all(results[idx][0] == records[idx].index[0] for idx in results)
    # A task the killed worker answered was not run again; every other task ran exactly once in
    # a live worker: the killed worker's unanswered tasks were re-run by its replacement, once.
    runs = _runs(str(tmp_path))
    rerun = 0
    for request, pid in results.values():
        survivors = [p for p in runs[request] if p != killed]
        if pid == killed:
            assert survivors == [], f"request {request} answered by the killed worker, then re-run"
        else:
            assert survivors == [pid], f"request {request} ran in {runs[request]}"
        rerun += pid == replacement
    assert rerun >= 1  # the replacement did re-run the killed worker's tasks

    # Shutdown leaves no process and gives every slot back.
    assert engine.closed and engine.pids == []
    children = psutil.Process().children(recursive=True)
    assert not [c.pid for c in children if c.pid in all_pids]
    assert not any(psutil.pid_exists(pid) for pid in all_pids if pid != killed)
    arena = context.current_arena
    assert arena is not None and arena.free_slots() == arena.num_slots
    context.close()


class Poison(torch.utils.data.Dataset):
    """Request i -> tensor([i]); request POISON kills the worker that runs it, every time."""

    POISON = 3

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.POISON:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)
        return torch.tensor([i], dtype=torch.int64)


@pytest.mark.timeout(90)
def test_a_task_that_kills_its_worker_is_retried_once_then_failed():
    """max_task_retries=1 (a request stream's choice): the poison task runs twice, then is
    answered Failed with a WorkerError; every other task is answered; nothing stays held."""
    from gpufeed.errors import WorkerError

    context = EngineContext(EngineConfig(max_batch_bytes=1 << 16), Stats())
    engine = Engine(context, WorkerSpec(dataset=Poison()), num_workers=2, max_task_retries=1)
    replies: dict[int, Done | Failed] = {}
    records = {}
    try:
        for request in range(8):
            record = engine.submit([request])
            records[record.idx] = record
        while len(replies) < len(records):
            for record, reply in engine.wait(timeout_s=30.0):
                assert record.idx not in replies, "a task was answered twice"
                replies[record.idx] = reply
                if isinstance(reply, Done):
                    assert engine.result(record, reply)[0].tolist() == [record.index[0]]
                else:
                    error = engine.failure(record, reply)
        assert engine.restarts == 2  # the first run and the one retry each killed a worker
    finally:
        engine.close()
    failed = [idx for idx, reply in replies.items() if isinstance(reply, Failed)]
    assert [records[idx].index for idx in failed] == [[Poison.POISON]]
    assert isinstance(error, WorkerError) and "max_task_retries=1" in str(error) and "SIGKILL" in str(error)
    arena = context.current_arena
    assert arena is not None and arena.free_slots() == arena.num_slots
    context.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("window_s", [None, 0.3])
def test_max_worker_restarts_counts_deaths_within_the_restart_window(window_s):
    """A long-lived driver (a server) bounds crash loops, not deaths over its whole life: with
    restart_window_s, replacements older than the window no longer count (the engine's clock is
    a manual one: the window passes exactly when the test says so)."""
    from gpufeed.errors import WorkerError

    clock = ManualClock()
    context = EngineContext(EngineConfig(max_batch_bytes=1 << 16, max_worker_restarts=1), Stats())
    engine = Engine(context, WorkerSpec(dataset=Poison()), num_workers=1, max_task_retries=0,
                    restart_window_s=window_s, clock=clock.now)
    try:
        record = engine.submit([Poison.POISON])
        (got, reply), = engine.wait(timeout_s=30.0)
        assert got is record and isinstance(reply, Failed)  # one death: replaced, task given up
        clock.advance(0.31)  # the first replacement is now older than a 0.3 s window
        engine.submit([Poison.POISON])
        if window_s is None:
            with pytest.raises(WorkerError, match="already replaced in this iterator"):
                while True:
                    engine.wait(timeout_s=30.0)
        else:
            (_, reply), = engine.wait(timeout_s=30.0)
            assert isinstance(reply, Failed) and engine.restarts == 2
    finally:
        engine.close()
        context.close()


def test_restart_window_must_be_positive():
    context = EngineContext(EngineConfig(max_batch_bytes=1 << 16), Stats())
    with pytest.raises(ValueError, match="restart_window_s"):
        Engine(context, WorkerSpec(dataset=Poison()), num_workers=1, restart_window_s=0)
    context.close()
