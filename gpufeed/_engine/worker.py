"""Worker process entry: setup, the task loop, error wrapping.

The messages a worker reads and sends are defined in ``gpufeed._engine.messages``. A task is
fetched and collated as torch's DataLoader would (``_MapFetcher`` / ``_IterableFetcher`` and the
``collate_fn``), or filled by the plug-in's ``BatchFiller`` (``gpufeed._engine.plugin``); either
way the result is packed into the task's arena slot (``transport.pack``).
"""

from __future__ import annotations

import functools
import gc
import os
import random
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.data._utils.collate as torch_collate
import torch.utils.data._utils.worker as torch_worker

from gpufeed._engine.arena import ArenaHandle, SlotWriter, take_warm
from gpufeed._engine.host import mark_worker
from gpufeed._engine.messages import (
    Claim,
    Done,
    End,
    Exit,
    Failed,
    InitFailed,
    Reset,
    Restore,
    Task,
    ToWorker,
    WorkerException,
)
from gpufeed._engine.signals import ignore_sigint
from gpufeed._engine.threads import settle, shutdown_pools, thread_pool
from gpufeed._engine.transport import pack
from gpufeed._resume.rng import RngTracker
from gpufeed.errors import add_note, check_int

if TYPE_CHECKING:
    from gpufeed._engine.plugin import BatchFiller, FillReport, Prefetched

FETCH_POOL = "gpufeed-fetch"
PARENT_POLL_S = 0.25
MAX_WARM_WAIT_S = 0.005  # longest wait for a warm slot per task
WARM_WAIT_FRACTION = 0.05  # ... and at most this share of the previous task's time
MAX_QUEUED_TASKS = 4  # tasks taken from the pipe early (the parent sends at most prefetch_factor)


@dataclass
class WorkerSpec:
    """Everything a worker needs; pickled as the process argument under spawn/forkserver.

    A driver gives what workers run (the dataset down to ``shared_seed``); the engine fills in
    the rest (arena, ids, plug-in filler, pinning, log directory) and the pool the per-process
    fields (``worker_id``, ``parent_pid``, ``inherited_fds``, ``stopping``).
    """

    dataset: Any
    is_iterable: bool = False
    auto_collation: bool = True
    collate_fn: Callable[[Any], Any] = torch_collate.default_collate
    drop_last: bool = False
    base_seed: int = 0
    worker_init_fn: Callable[[int], None] | None = None
    shared_seed: int | None = None
    worker_id: int = 0
    num_workers: int = 1
    arena: ArenaHandle | None = None
    parent_pid: int = 0  # the loader's process when it is our parent (fork, spawn), else 0
    inherited_fds: tuple[int, ...] = ()  # parent-side pipe ends to close after a fork
    filler: BatchFiller | None = None  # a plug-in's worker half replaces fetch + collate
    pin_cpus: tuple[int, ...] = ()  # pin_workers: worker k runs on pin_cpus[k % len]
    log_dir: str | None = None  # per-worker log files: LOG_DIR/worker-K.log
    stopping: Any = None  # shared byte (multiprocessing RawValue), set when the pool shuts down
    fetch_threads: int = 0  # map-style, no __getitems__: call __getitem__ on this many threads
    track_rng: bool = False  # send the random states with Done when they changed (resume)
    track_dataset: bool = False  # send the IterableDataset copy's state_dict() with each Done (resume)


def fetch_threads_of(dataset: Any) -> int:
    """The dataset's ``fetch_threads`` attribute (0 if absent), checked.

    Set it on a thread-safe map-style dataset (``ds.fetch_threads = 8``) to have each worker call
    ``__getitem__`` for the samples of a batch on that many threads (order kept); it is the
    generic path's way to keep many slow reads in flight. Off (0) by default, since user code
    need not be thread-safe; a ``__getitems__`` takes precedence.
    """
    value = getattr(dataset, "fetch_threads", 0)
    if value is None:
        return 0
    return check_int("fetch_threads", value, 0, subject="the dataset's ")


class _MapFetcher:
    def __init__(self, spec: WorkerSpec) -> None:
        self.dataset, self.auto, self.collate = spec.dataset, spec.auto_collation, spec.collate_fn
        self.threads = spec.fetch_threads

    def fetch(self, index: Any) -> Any:
        if self.auto:
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems:
                return getitems(index)
            if self.threads > 1 and len(index) > 1:
                return self._fetch_on_threads(index)
            return [self.dataset[i] for i in index]
        return self.dataset[index]

    def _fetch_on_threads(self, index: list[Any]) -> list[Any]:
        """``[dataset[i] for i in index]``, called on ``fetch_threads`` threads; the first error
        in index order is raised, after the other calls are cancelled or finished."""
        pool = thread_pool(FETCH_POOL, self.threads)
        futures = [pool.submit(self.dataset.__getitem__, i) for i in index]
        try:
            return [f.result() for f in futures]
        finally:
            settle(futures)


class _IterableFetcher:
    """The worker's iterator over its IterableDataset copy, made at the first fetch (so a
    ``Restore`` loads the dataset's state before its ``iter()``; torch reports an error in
    ``__iter__`` with the first batch, too)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.dataset = spec.dataset
        self.iterator: Any = None
        self.auto, self.drop_last = spec.auto_collation, spec.drop_last
        self.ended = False

    def fetch(self, index: Any) -> Any:
        if self.ended:
            raise StopIteration
        if self.iterator is None:
            self.iterator = iter(self.dataset)
        if not self.auto:
            return next(self.iterator)
        data = []
        for _ in index:
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return data


_Fetcher = _MapFetcher | _IterableFetcher
_writer: SlotWriter | None = None  # the current process's slot writer (worker processes only)
_torch_collate_tensor = torch_collate.collate_tensor_fn


def _collate_tensor_into_slot(
    batch: list[torch.Tensor], *, collate_fn_map: dict[Any, Callable[..., Any]] | None = None
) -> torch.Tensor:
    """torch's tensor collate, but the stacked output lives in the current arena slot.

    Installed in worker processes only, so ``default_collate`` (ours or one a user's collate_fn
    calls) never allocates torch shared memory, which lives in ``/dev/shm``. Tensors that already
    lie in the slot one after another (the per-sample path's images and masks) are not copied:
    the batch is a view of them (``SlotWriter.stacked``), so they share its memory, which only an
    in-place change to one of them after the collate could tell apart from a copy.
    """
    elem = batch[0]
    w = _writer
    if w is not None and w.active and _stackable(elem):
        if all(type(t) is torch.Tensor and not t.requires_grad for t in batch):
            view = w.stacked(batch)  # laid out as a stack by the per-sample output stage
            if view is not None:
                return view
        out = w.tensor((len(batch), *elem.shape), elem.dtype)
        if out is not None:
            return torch.stack(batch, 0, out=out)
    stacked: torch.Tensor = _torch_collate_tensor(batch, collate_fn_map=collate_fn_map)
    return stacked


def _stackable(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.layout == torch.strided and t.device.type == "cpu" and not t.is_nested


def _watch_parent(parent_pid: int, task_fd: int) -> None:
    """Exit when the loader's process is gone, even while the main thread is busy.

    Two signs: the parent pid changed (fork/spawn: the loader's process is our parent), or the
    task pipe hung up (every start method, forkserver included, whose parent is the server).
    """
    poller = select.poll()
    poller.register(task_fd, select.POLLHUP)
    while True:
        hung_up = any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(PARENT_POLL_S * 1000))
        if hung_up or (parent_pid and os.getppid() != parent_pid):
            os._exit(0)


def _setup(spec: WorkerSpec) -> Any:
    """Seeds, worker info, dataset pipes: mirrors torch's worker set-up so results match."""
    seed = spec.base_seed + spec.worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(spec.base_seed, spec.worker_id))  # type: ignore[no-untyped-call]
    dataset = spec.dataset
    from torch.utils.data import IterDataPipe
    from torch.utils.data.graph_settings import apply_random_seed

    if isinstance(dataset, IterDataPipe) and spec.shared_seed is not None:
        dataset = apply_random_seed(dataset, torch.Generator().manual_seed(spec.shared_seed))
        spec.dataset = dataset
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=spec.worker_id, num_workers=spec.num_workers, seed=seed, dataset=dataset
    )
    return dataset


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a gpufeed worker process (module level so spawn can import it)."""
    global _writer
    ignore_sigint()  # Ctrl-C is the parent's to handle
    # Everything inherited from the parent goes to the GC's permanent generation: a collection
    # here would otherwise write the GC header of every object the parent made, copying the
    # parent's whole heap page by page (measured: worker USS 62-68 MiB -> 28-29 MiB).
    gc.freeze()
    for fd in spec.inherited_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    threading.Thread(
        target=_watch_parent, args=(spec.parent_pid, tasks.fileno()), name="gpufeed-parent-watch", daemon=True
    ).start()
    _configure_process(spec)
    torch.set_num_threads(1)  # one core per worker, or the workers oversubscribe the machine
    if spec.filler is not None:
        spec.filler.setup()
    _setup(spec)
    assert spec.arena is not None, "the engine fills in the arena"
    _writer = SlotWriter(spec.arena)
    torch_collate.default_collate_fn_map[torch.Tensor] = _collate_tensor_into_slot
    try:
        if spec.worker_init_fn is not None:
            spec.worker_init_fn(spec.worker_id)
        fetcher = _make_fetcher(spec)
        tracker = RngTracker() if spec.track_rng else None  # after worker_init_fn: its seeds count
    except Exception as exc:  # noqa: BLE001 (user code: reported to the parent, which raises it)
        results.send(InitFailed(error=WorkerException.capture(exc)))
        return
    try:
        _loop(spec, fetcher, tasks, results, tracker)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing left to do
    finally:
        try:
            if spec.filler is not None:
                spec.filler.teardown()  # its own threads first (the image path's read-ahead)
        finally:
            shutdown_pools()


def _configure_process(spec: WorkerSpec) -> None:
    """The process's name (``gpufeed-wK``), CPU affinity (pin_workers) and the per-worker log
    file (log_dir)."""
    mark_worker(spec.worker_id)
    if spec.pin_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.pin_cpus[spec.worker_id % len(spec.pin_cpus)]})
    if spec.log_dir:
        import logging

        os.makedirs(spec.log_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(spec.log_dir, f"worker-{spec.worker_id}.log"))
        fmt = f"%(asctime)s worker {spec.worker_id} pid %(process)d %(levelname)s %(name)s: %(message)s"
        handler.setFormatter(logging.Formatter(fmt))
        root = logging.getLogger()
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)


def _make_fetcher(spec: WorkerSpec) -> _Fetcher:
    return _IterableFetcher(spec) if spec.is_iterable else _MapFetcher(spec)


@dataclass(slots=True)
class _LoopState:
    """What a worker's task loop keeps between messages (one per worker process)."""

    spec: WorkerSpec
    tasks: Connection
    results: Connection
    writer: SlotWriter
    warm_fd: int  # the arena's pipe of warm slots
    fetcher: _Fetcher
    tracker: RngTracker | None = None
    reported_end: bool = False  # this epoch's end was sent: like torch, later tasks get no reply
    failed_restore: Exception | None = None  # a Restore's error, the reply of the next task
    last_task_s: float = 0.0  # how long the previous task took, reply included (s)
    # Messages taken from the pipe ahead of their turn, with what the filler's prefetch started
    # for them; handled in pipe order, so only the prefetch happens early.
    queued: deque[tuple[ToWorker, Prefetched | None]] = field(default_factory=deque)

    def next_message(self) -> tuple[ToWorker, Prefetched | None]:
        """The next message in pipe order (one taken ahead first), with its prefetch if any."""
        return self.queued.popleft() if self.queued else (self.tasks.recv(), None)

    def more(self) -> None:
        """The filler's way to begin the tasks that arrive while it fills one."""
        try:
            _take_queued(self.spec, self.tasks, self.queued)
        except (EOFError, OSError):
            pass  # the parent went away: the loop's own recv meets it

    def reset(self) -> None:
        """A new pass: a fresh iterator of the dataset."""
        self.fetcher = _make_fetcher(self.spec)
        self.reported_end = False

    def restore(self, msg: Restore) -> None:
        """Apply a resumed pass's states; an error becomes the reply of the next task."""
        self.failed_restore = _restore(self.spec, self.tracker, msg)
        if msg.dataset_state is not None:
            self.reset()  # its iterator starts where the loaded state says

    def run(self, msg: Task, ahead: Prefetched | None) -> None:
        """Fill ``msg``'s slot and send its reply (skipped when stopping or past the epoch's end)."""
        spec, w = self.spec, self.writer
        if self.reported_end or _stopping(spec):
            _close(ahead)  # shutting down (as torch's done_event): queued tasks are skipped, not run
            return
        if spec.filler is not None:
            if ahead is None:
                ahead = _prefetch(spec, msg)
            _take_queued(spec, self.tasks, self.queued)
        if msg.swap:
            wait_s = min(MAX_WARM_WAIT_S, WARM_WAIT_FRACTION * self.last_task_s)
            w.begin_late(functools.partial(_pick_slot, self.warm_fd, self.results, msg.epoch, msg.idx,
                                           msg.slot, wait_s))
        else:
            w.begin(msg.slot)
        t0 = time.perf_counter()
        reply: Done | Failed | End
        try:
            if self.failed_restore is not None:
                error, self.failed_restore = self.failed_restore, None
                raise error
            reply = _run(spec, self.fetcher, msg, w, ahead, self.tracker, self.more)
        except StopIteration as exc:
            if isinstance(self.fetcher, _IterableFetcher):
                self.reported_end = True
                reply = End(epoch=msg.epoch, idx=msg.idx)
            else:
                reply = Failed(epoch=msg.epoch, idx=msg.idx, error=WorkerException.capture(exc))
        except Exception as exc:  # noqa: BLE001 (user code: the parent re-raises it)
            reply = Failed(epoch=msg.epoch, idx=msg.idx, error=WorkerException.capture(exc))
        finally:
            w.end()
            _close(ahead)
        self.results.send(reply)
        del reply
        self.last_task_s = time.perf_counter() - t0

    def close_queued(self) -> None:
        """Release what the prefetch started for messages never handled."""
        for _, ahead in self.queued:
            _close(ahead)


def _loop(spec: WorkerSpec, fetcher: _Fetcher, tasks: Connection, results: Connection,
          tracker: RngTracker | None = None) -> None:
    assert _writer is not None and spec.arena is not None
    state = _LoopState(spec, tasks, results, _writer, spec.arena.warm_fd, fetcher, tracker)
    try:
        while True:
            msg, ahead = state.next_message()
            match msg:
                case Exit():
                    return
                case Reset():
                    state.reset()
                case Restore():
                    state.restore(msg)
                case Task():
                    state.run(msg, ahead)
    finally:
        state.close_queued()


def _stopping(spec: WorkerSpec) -> bool:
    return spec.stopping is not None and bool(spec.stopping.value)


def _take_queued(spec: WorkerSpec, tasks: Connection, queued: deque[tuple[ToWorker, Prefetched | None]]) -> None:
    """Take the messages already waiting in the task pipe (up to ``MAX_QUEUED_TASKS``, none past
    a ``Reset`` or ``Exit``) and start the prefetch of their tasks, so their reads run while the
    current task is filled (without it each batch began with one read's latency; see
    docs/design/image-path.md). Called when a task begins, and by the filler while it fills."""
    if any(not isinstance(msg, Task) for msg, _ in queued):
        return  # what follows a Reset or Exit is for later
    while len(queued) < MAX_QUEUED_TASKS and not _stopping(spec) and tasks.poll(0):
        msg: ToWorker = tasks.recv()
        queued.append((msg, _prefetch(spec, msg) if isinstance(msg, Task) else None))
        if not isinstance(msg, Task):
            return  # Reset or Exit: what follows is for later


def _prefetch(spec: WorkerSpec, task: Task) -> Prefetched | None:
    """The filler's prefetch of ``task``; on an error, nothing (``fill`` then meets it itself)."""
    assert spec.filler is not None
    try:
        return spec.filler.prefetch(spec.dataset, task.index, task.extra)
    except Exception:  # noqa: BLE001 (fill raises it in its turn, with the task's context)
        return None


def _close(ahead: Prefetched | None) -> None:
    if ahead is not None:
        ahead.close()


def _restore(spec: WorkerSpec, tracker: RngTracker | None, msg: Restore) -> Exception | None:
    """Apply a ``Restore``; an error in the dataset's ``load_state_dict`` is returned (it becomes
    the reply of the next task, with the worker's traceback)."""
    try:
        if msg.dataset_state is not None:
            spec.dataset.load_state_dict(msg.dataset_state)
        if tracker is not None and msg.rng is not None:
            tracker.restore(msg.rng)
    except Exception as exc:  # noqa: BLE001 (user code: the parent re-raises it)
        add_note(exc, f"gpufeed: raised restoring worker {spec.worker_id}'s state from FastLoader.load_state_dict().")
        return exc
    return None


def _run(spec: WorkerSpec, fetcher: _Fetcher, task: Task, w: SlotWriter, ahead: Prefetched | None = None,
         tracker: RngTracker | None = None, more: Callable[[], None] = lambda: None) -> Done:
    """Fetch and collate (or fill) ``task`` and pack it into the slot; with state tracking, the
    reply carries the dataset's state and the random states that changed (``more``: the
    filler's way to take the tasks that arrive meanwhile)."""
    t0 = time.perf_counter()
    report: FillReport | None = None
    if spec.filler is None:
        data = fetcher.fetch(task.index)
        t1 = time.perf_counter()
        data = spec.collate_fn(data)
        t2 = time.perf_counter()
    else:
        data, report = spec.filler.fill(spec.dataset, task.index, task.extra, w, ahead, more)
        t1 = t0 + report.read_s
        t2 = time.perf_counter()
    skeleton, used, overflow = pack(data, w)
    del data
    t3 = time.perf_counter()
    dataset_state = spec.dataset.state_dict() if spec.track_dataset else None  # before: it may raise
    rng = tracker.changes() if tracker is not None else None
    return Done(epoch=task.epoch, idx=task.idx, skeleton=skeleton, used_bytes=used, overflow_bytes=overflow,
                fetch_s=t1 - t0, collate_s=t2 - t1, pack_s=t3 - t2, report=report, rng=rng,
                dataset_state=dataset_state)


def _pick_slot(warm_fd: int, results: Connection, epoch: int, task_idx: int, fallback: int, wait_s: float) -> int:
    """A warm slot from the arena's pipe, else the task's cold fallback.

    When none waits, wait up to ``wait_s`` seconds for one: the consumer usually frees the batch
    before this one right after this worker's last reply reached it, and taking that slot saves
    writing a cold one (a page fault per 4 KiB) and keeping one more batch of memory. A consumer
    slower than the workers makes the wait free (the loader is not the bottleneck); one that
    holds on to its batches costs at most ``wait_s`` per task.

    The parent is told before any byte is written there, so a worker that dies later cannot
    strand the slot; only a death in the instant between the read and the send could.
    """
    warm = take_warm(warm_fd)
    if warm is None and wait_s > 0:
        poller = select.poll()  # not select(): it rejects descriptors >= 1024 (many files open)
        poller.register(warm_fd, select.POLLIN)
        poller.poll(wait_s * 1000)
        warm = take_warm(warm_fd)
    if warm is None:
        return fallback
    results.send(Claim(epoch=epoch, idx=task_idx, slot=warm))
    return warm
