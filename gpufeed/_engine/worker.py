"""Worker process entry: setup, the task loop, error wrapping.

Messages (pickled over per-worker pipes; payloads never travel here, they stay in the arena):

parent -> worker
    ("task", epoch, task_idx, slot, index, extra, swap)
                                             fetch ``index`` (a batch of indices, one index, or
                                             None for iterable datasets), collate, pack into
                                             ``slot``, or, with ``swap``, into a warm slot taken
                                             from the arena's pipe; ``extra`` is an ImageTask on
                                             the image path
    ("reset", epoch)                         new epoch (persistent workers): fresh dataset iterator
    None                                     exit
worker -> parent
    ("claim", epoch, task_idx, slot)         this task is written into warm ``slot`` instead
    ("ok", epoch, task_idx, skeleton, slot_bytes_used, overflow_bytes, fetch_s, collate_s, pack_s,
     report)                                 report: a FillReport on the image path, else None
    ("err", epoch, task_idx, error)          a ``WorkerException`` from dataset/collate code
    ("end", epoch, task_idx)                 the worker's IterableDataset is exhausted
    ("init_err", error)                      worker_init_fn (or fetcher set-up) raised
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import random
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.data._utils.collate as torch_collate
import torch.utils.data._utils.worker as torch_worker

from gpufeed._engine.arena import ArenaHandle, SlotWriter, take_warm
from gpufeed._image.fill import ImagePlan, fill_batch
from gpufeed._engine.transport import pack

PARENT_POLL_S = 0.25
MAX_WARM_WAIT_S = 0.005  # longest wait for a warm slot per task
WARM_WAIT_FRACTION = 0.05  # ... and at most this share of the previous task's time


@dataclass
class WorkerSpec:
    """Everything a worker needs; pickled as the process argument under spawn/forkserver."""

    dataset: Any
    is_iterable: bool
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    base_seed: int
    worker_init_fn: Callable[[int], None] | None
    worker_id: int
    num_workers: int
    shared_seed: int | None
    arena: ArenaHandle
    parent_pid: int  # the loader's process when it is our parent (fork, spawn), else 0
    inherited_fds: tuple[int, ...]  # parent-side pipe ends to close after a fork
    image_plan: ImagePlan | None = None  # the image fast path replaces fetch + collate
    pin_cpus: tuple[int, ...] = ()  # pin_workers: worker k runs on pin_cpus[k % len]
    log_dir: str | None = None  # per-worker log files: LOG_DIR/worker-K.log
    stopping: Any = None  # shared byte (multiprocessing RawValue), set when the pool shuts down


@dataclass
class WorkerException:
    """An exception from user code, in a form that survives pickling whatever its type."""

    pickled: bytes | None
    pickled_type: bytes | None
    type_name: str
    message: str
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException) -> WorkerException:
        def dumps(obj: object) -> bytes | None:
            try:
                return pickle.dumps(obj)
            except Exception:  # unpicklable exception: rebuilt from its type and message
                return None

        return cls(
            pickled=dumps(exc),
            pickled_type=dumps(type(exc)),
            type_name=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
        )

    def rebuild(self) -> BaseException:
        """The original exception if it unpickles, else its type with the message, else RuntimeError."""
        for attempt in (self._from_instance, self._from_type):
            try:
                exc = attempt()
            except Exception:
                continue
            if isinstance(exc, BaseException):
                return exc
        return RuntimeError(f"{self.type_name}: {self.message}")

    def _from_instance(self) -> BaseException | None:
        return None if self.pickled is None else pickle.loads(self.pickled)

    def _from_type(self) -> BaseException | None:
        """The type, without running its ``__init__`` (which may want other arguments)."""
        if self.pickled_type is None:
            return None
        exc_type = pickle.loads(self.pickled_type)
        exc = exc_type.__new__(exc_type, self.message)
        exc.args = (self.message,)
        return exc


class _MapFetcher:
    def __init__(self, spec: WorkerSpec) -> None:
        self.dataset, self.auto, self.collate = spec.dataset, spec.auto_collation, spec.collate_fn

    def fetch(self, index: Any) -> Any:
        if self.auto:
            getitems = getattr(self.dataset, "__getitems__", None)
            data = getitems(index) if getitems else [self.dataset[i] for i in index]
        else:
            data = self.dataset[index]
        return data


class _IterableFetcher:
    def __init__(self, spec: WorkerSpec) -> None:
        self.iterator = iter(spec.dataset)
        self.auto, self.drop_last = spec.auto_collation, spec.drop_last
        self.ended = False

    def fetch(self, index: Any) -> Any:
        if self.ended:
            raise StopIteration
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


_writer: SlotWriter | None = None  # the current process's slot writer (worker processes only)
_torch_collate_tensor = torch_collate.collate_tensor_fn


def _collate_tensor_into_slot(batch, *, collate_fn_map=None):
    """torch's tensor collate, but the stacked output lives in the current arena slot.

    Installed in worker processes only, so ``default_collate`` (ours or one a user's collate_fn
    calls) never allocates torch shared memory, which lives in ``/dev/shm``.
    """
    elem = batch[0]
    w = _writer
    if w is not None and w.active and _stackable(elem):
        out = w.tensor((len(batch), *elem.shape), elem.dtype)
        if out is not None:
            return torch.stack(batch, 0, out=out)
    return _torch_collate_tensor(batch, collate_fn_map=collate_fn_map)


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
    np.random.seed(torch_worker._generate_state(spec.base_seed, spec.worker_id))
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


def worker_main(spec: WorkerSpec, tasks, results) -> None:
    """Entry point of a gpufeed worker process (module level so spawn can import it)."""
    global _writer
    # Everything inherited from the parent goes to the GC's permanent generation: a collection
    # here would otherwise write the GC header of every object the parent made, copying the
    # parent's whole heap page by page (measured: worker USS 62-68 MiB -> 28-29 MiB).
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
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
    if spec.image_plan is not None and "cv2" not in sys.modules:
        import cv2  # a fresh import (spawn, or a parent without cv2) may be configured safely

        cv2.setNumThreads(1)  # (inherited via fork, the parent already forked us at 1 thread)
    _setup(spec)
    _writer = SlotWriter(spec.arena)
    torch_collate.default_collate_fn_map[torch.Tensor] = _collate_tensor_into_slot
    try:
        if spec.worker_init_fn is not None:
            spec.worker_init_fn(spec.worker_id)
        fetcher = _make_fetcher(spec)
    except Exception as exc:
        results.send(("init_err", WorkerException.capture(exc)))
        return
    try:
        _loop(spec, fetcher, tasks, results)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing left to do


def _configure_process(spec: WorkerSpec) -> None:
    """CPU affinity (pin_workers) and the per-worker log file (log_dir)."""
    if spec.pin_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.pin_cpus[spec.worker_id % len(spec.pin_cpus)]})
    if spec.log_dir:
        import logging

        os.makedirs(spec.log_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(spec.log_dir, f"worker-{spec.worker_id}.log"))
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s worker {spec.worker_id} pid %(process)d %(levelname)s %(name)s: %(message)s")
        )
        root = logging.getLogger()
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)


def _make_fetcher(spec: WorkerSpec) -> _MapFetcher | _IterableFetcher:
    return _IterableFetcher(spec) if spec.is_iterable else _MapFetcher(spec)


def _loop(spec: WorkerSpec, fetcher, tasks, results) -> None:
    w = _writer
    assert w is not None
    reported_end = False  # this epoch's end was sent: like torch, later tasks get no reply
    last_task_s = 0.0  # how long the previous task took, reply included (s)
    while True:
        msg = tasks.recv()
        if msg is None:
            return
        if msg[0] == "reset":
            fetcher = _make_fetcher(spec)
            reported_end = False
            continue
        _, epoch, task_idx, slot, index, extra, swap = msg
        if reported_end or (spec.stopping is not None and spec.stopping.value):
            continue  # shutting down (as torch's done_event): queued tasks are skipped, not run
        if swap:
            wait_s = min(MAX_WARM_WAIT_S, WARM_WAIT_FRACTION * last_task_s)
            w.begin_late(functools.partial(_pick_slot, spec.arena.warm_fd, results, epoch, task_idx, slot, wait_s))
        else:
            w.begin(slot)
        try:
            t0 = time.perf_counter()
            report = None
            if spec.image_plan is None:
                data = fetcher.fetch(index)
                t1 = time.perf_counter()
                data = spec.collate_fn(data)
                t2 = time.perf_counter()
            else:
                data, report = _fill(spec.image_plan, spec.dataset, index, extra, w)
                t1 = t0 + report.read_s
                t2 = time.perf_counter()
            skeleton, used, overflow = pack(data, w)
            t3 = time.perf_counter()
            reply = ("ok", epoch, task_idx, skeleton, used, overflow, t1 - t0, t2 - t1, t3 - t2, report)
        except StopIteration as exc:
            if isinstance(fetcher, _IterableFetcher):
                reported_end = True
                reply = ("end", epoch, task_idx)
            else:
                reply = ("err", epoch, task_idx, WorkerException.capture(exc))
        except Exception as exc:
            reply = ("err", epoch, task_idx, WorkerException.capture(exc))
        finally:
            w.end()
            data = None
        results.send(reply)
        del reply
        last_task_s = time.perf_counter() - t0


def _pick_slot(warm_fd: int, results, epoch: int, task_idx: int, fallback: int, wait_s: float) -> int:
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
    results.send(("claim", epoch, task_idx, warm))
    return warm


def _fill(plan: ImagePlan, source: Any, indices: list[int], task: Any, w: SlotWriter):
    """Image path: lay the batch out in the slot, stage encoded misses after the parent's hits."""
    labels, floats, staging = plan.offsets(len(indices))
    if staging > w.capacity:
        raise ValueError(
            f"a batch of {len(indices)} images of {plan.hw} needs {staging} bytes of arena slot, "
            f"more than max_batch_bytes={w.capacity}; raise max_batch_bytes or lower batch_size"
        )
    w.mark(0, len(indices) * plan.row_bytes)
    w.mark(labels, 8 * len(indices))
    if floats != staging:
        w.mark(floats, staging - floats)
    w.seek(staging + task.staging_used)
    stage = (lambda pos, data: w.stage(data)) if plan.cache == "encoded" else None
    return fill_batch(plan, source, indices, task, lambda: w.buffer, stage)
