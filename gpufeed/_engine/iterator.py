"""One pass over a FastLoader with ``num_workers > 0``: torch's policy driving the engine.

The engine (``gpufeed._engine.engine``) runs the workers, the arena slots, worker replacement
and shutdown. This module decides what torch's ``_MultiProcessingDataLoaderIter`` decides,
decision for decision, so per-worker random streams see the same samples as under
``torch.utils.data.DataLoader``: which worker gets which batch, how many are in flight, what
``in_order`` does, how exhausted IterableDataset workers are skipped, timeouts. The sampler,
base seed and length checks come from torch's ``_BaseDataLoaderIter`` itself.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, IterDataPipe, MapDataPipe
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter, _sharding_worker_init_fn

from gpufeed._engine.context import EngineContext
from gpufeed._engine.engine import Arrival, Engine, TaskRecord, WorkerDeath
from gpufeed._engine.messages import Done, End, Failed, Restore
from gpufeed._engine.plugin import PassTag
from gpufeed._engine.worker import WorkerSpec, fetch_threads_of
from gpufeed._resume.indices import pulled_number
from gpufeed._resume.positions import WorkerPositions, WorkerResume
from gpufeed.errors import LoaderTimeoutError, WorkerError

if TYPE_CHECKING:
    from torch.utils.data import DataLoader


@dataclass(slots=True)
class _Task:
    """A batch of this pass: the engine's record, and its reply once taken in."""

    record: TaskRecord
    pull: int = 0  # its place in the pass's index stream (in_order=False hands it out elsewhere)
    reply: Done | Failed | None = None

    @property
    def worker_id(self) -> int:
        return self.record.worker_id

    @property
    def index(self) -> Any:
        return self.record.index


class FastIter(_BaseDataLoaderIter):
    """Iterator of a FastLoader with workers; persistent workers reuse it across epochs.

    ``loader`` is read for torch's own attributes only (sampler, collate_fn, seeds, options);
    everything of gpufeed's comes from ``context``. ``aug_epoch``: the augmentation epoch of the
    first pass (``next_epoch`` gives the next ones).
    """

    # The state of one pass (set by _reset), as torch's _MultiProcessingDataLoaderIter keeps it.
    _send_idx: int  # tasks submitted
    _pulls: int  # index batches taken from the sampler this pass
    _rcvd_idx: int  # the next task to hand out (in order)
    _task_info: dict[int, _Task]  # tasks neither handed out nor skipped
    _tasks_outstanding: int
    _workers_status: list[bool]  # False: the worker's IterableDataset ended
    _workers_num_tasks: list[int]
    _worker_queue_idx_cycle: Iterator[int]
    _ready: list[Arrival]  # replies taken in, not looked at yet, in arrival order
    # Counts the batches handed to the user (``.yielded += 1``): the loader's position record.
    on_yield: Any = None
    # With in_order=False: the pulls (places in the index stream) of the batches handed out, in
    # the order they were handed out (the loader's position record, list owned by its Pass).
    order_log: list[int] | None = None
    # The loader's record of the pass (``yielded``: batches the user received; for an
    # IterableDataset, ``finished`` is set here at its end). None: not resumable.
    position: Any = None
    positions: WorkerPositions  # per-worker states of this pass (docs/design/resume.md)

    def __init__(self, loader: DataLoader[Any], context: EngineContext, aug_epoch: int,
                 resume: WorkerResume | None = None) -> None:
        # ``resume``: the workers' part of a loaded state. Its base seed replaces the one torch
        # draws here, and that draw is undone: the resumed run draws what the checkpointed one did
        # (a persistent iterator's later passes draw none).
        generator = loader.generator
        drawn_from: Any = None if resume is None else (generator.get_state() if generator is not None
                                                  else torch.get_rng_state())
        super().__init__(loader)
        self._resume = resume
        if resume is not None:
            self._base_seed = resume.base_seed
            if generator is not None:
                generator.set_state(drawn_from)
            else:
                torch.set_rng_state(drawn_from)
        prefetch_factor = loader.prefetch_factor
        if prefetch_factor is None or prefetch_factor <= 0:  # torch accepts 0 at construction and fails here
            raise AssertionError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._prefetch_factor = prefetch_factor
        self._in_order = loader.in_order
        self._stats = context.stats
        self._plugin = context.plugin
        self._aug_epoch = aug_epoch
        init_fn = loader.worker_init_fn
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):
            init_fn = _sharding_init(init_fn, self._world_size, self._rank)
        self._is_iterable = isinstance(self._dataset, IterableDataset)
        spec = WorkerSpec(
            dataset=self._dataset,
            is_iterable=self._is_iterable,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            base_seed=int(self._base_seed),
            worker_init_fn=init_fn,
            shared_seed=self._shared_seed,
            fetch_threads=0 if self._is_iterable else fetch_threads_of(self._dataset),
            track_rng=True,
            track_dataset=self._is_iterable and all(
                callable(getattr(self._dataset, name, None)) for name in ("state_dict", "load_state_dict")),
        )
        self._engine = Engine(
            context,
            spec,
            self._num_workers,
            mp_context=loader.multiprocessing_context or multiprocessing.get_context(),
            tasks_in_flight=self._prefetch_factor * self._num_workers,
            # The image path may complete batches in the parent (all rows cache hits): a worker
            # starts at its first task, so a fully cached pass starts none. Generic datasets
            # start every worker now, as torch does (worker_init_fn runs even for an idle one).
            lazy_workers=context.plugin is not None,
        )
        self._reset(loader, first_iter=True)

    # -- public introspection -------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes (for monitoring and fault tests)."""
        return self._engine.pids

    @property
    def workers_started(self) -> int:
        """Worker processes this iterator started (replacements included); with the image
        path they start lazily, so a fully cached epoch starts none."""
        return self._engine.workers_started

    @property
    def worker_restarts(self) -> int:
        return self._engine.restarts

    def close(self) -> None:
        """Stop the workers and release their slots now (idempotent)."""
        self._engine.close()

    # -- epoch set-up -----------------------------------------------------------------------
    @property
    def base_seed(self) -> int:
        """The seed worker k's generators were seeded from (plus k)."""
        return int(self._base_seed)

    def next_epoch(self, loader: DataLoader[Any], aug_epoch: int, resume: WorkerResume | None = None) -> None:
        """Start another pass over ``loader`` (persistent workers), with augmentation epoch
        ``aug_epoch``, resuming the workers' states of ``resume`` (taken with this base seed).
        (torch's ``DataLoader.__iter__`` calls ``_reset``; FastLoader calls this.)"""
        if resume is not None and resume.base_seed != self.base_seed:
            raise RuntimeError(
                f"gpufeed: resuming workers seeded from base seed {resume.base_seed} with persistent workers "
                f"seeded from {self.base_seed}; the loader restarts its workers for such a state.")
        self._aug_epoch = aug_epoch
        self._resume = resume
        self._reset(loader)

    def _reset(self, loader: DataLoader[Any], first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        if self._engine.closed:
            raise RuntimeError("gpufeed: this iterator's workers were shut down (loader closed)")
        if not first_iter:
            self._engine.new_epoch()
            for record, _ in self._ready:  # answered, never looked at
                self._engine.drop(record)
            for task in self._task_info.values():
                # Answered but never yielded: drop now. Unanswered: dropped when the stale reply
                # comes, unless the worker had ended (it will never reply to this epoch).
                if task.reply is not None or not self._workers_status[task.worker_id]:
                    self._engine.drop(task.record)
        self._send_idx = 0
        self._pulls = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        self._ready = []
        self._start_positions()
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _start_positions(self) -> None:
        """The pass's per-worker states: a resumed pass restores the loaded ones in the workers
        (before their first task) and starts the round-robin at the loaded worker; otherwise
        persistent workers carry theirs over from the last pass."""
        resume, self._resume = self._resume, None
        n = self._num_workers
        previous = getattr(self, "positions", None)
        if resume is None:
            rng = previous.carry() if previous is not None else [None] * n
            self.positions = WorkerPositions(n, self.base_seed, 0, rng, [None] * n if self._is_iterable else None)
            return
        self.positions = WorkerPositions(n, self.base_seed, resume.next_worker, list(resume.rng),
                                         resume.datasets, resume.exhausted)
        for worker_id in range(n):
            dataset_state = resume.datasets[worker_id] if resume.datasets is not None else None
            if resume.exhausted[worker_id]:
                self._workers_status[worker_id] = False
                dataset_state = None
            self._engine.restore(worker_id, Restore(rng=resume.rng[worker_id], dataset_state=dataset_state))
        for _ in range(resume.next_worker):
            next(self._worker_queue_idx_cycle)

    # -- dispatch (torch's policy) ----------------------------------------------------------
    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()  # type: ignore[no-untyped-call]
        except StopIteration:
            return
        pull = self._pulls
        self._pulls += 1
        for _ in range(self._num_workers):
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        tag = PassTag(self._aug_epoch, pulled_number(self._index_sampler, pull))
        if self._plugin is not None:
            index = self._plugin.task_index(index)
        record = self._engine.submit(index, worker_id=worker_id, tag=tag)
        self._task_info[self._send_idx] = _Task(record, pull)
        self._workers_num_tasks[worker_id] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    # -- receiving --------------------------------------------------------------------------
    def _next_data(self) -> Any:
        t_start = time.perf_counter()
        self._poll(0.0)  # replies already sitting in the pipes count as queued, too
        depth = len(self._ready) + sum(1 for t in self._task_info.values() if t.reply is not None)
        try:
            return self._next_data_inner()
        finally:
            self._stats.add_wait(time.perf_counter() - t_start, depth)

    def _next_data_inner(self) -> Any:
        while True:
            while self._rcvd_idx < self._send_idx:
                task = self._task_info.get(self._rcvd_idx)
                if task is not None:
                    if task.reply is not None or self._workers_status[task.worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]  # its worker ended and will never answer
                    self._engine.drop(task.record)
                    self.positions.ended(task.worker_id)
                self._rcvd_idx += 1
            else:
                if self._is_iterable and self.position is not None:
                    self.position.finished = True
                if not self._persistent_workers:
                    self.close()
                raise StopIteration

            task = self._task_info[self._rcvd_idx]
            if task.reply is not None:
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(task)

            record, reply = self._get_reply()
            self._tasks_outstanding -= 1
            task = self._task_info[record.idx]
            if isinstance(reply, End):  # like torch: the task stays unanswered and is skipped above
                self._workers_status[task.worker_id] = False
                self._try_put_index()
                continue
            task.reply = reply
            if record.idx != self._rcvd_idx:
                if not self._in_order:
                    del self._task_info[record.idx]
                    return self._process(task)
                continue  # keep it for its turn
            del self._task_info[record.idx]
            self._rcvd_idx += 1
            return self._process(task)

    def _get_reply(self) -> Arrival:
        """The next reply of a current-epoch task; handles deaths and timeouts."""
        timeout_s = self._timeout
        if not self._ready:
            self._ready = self._engine.wait(timeout_s if timeout_s > 0 else None, self._check_death)
            if not self._ready:
                raise self._timeout_error(timeout_s)
        return self._ready.pop(0)

    def _poll(self, wait_s: float) -> None:
        """Take in what the workers sent within ``wait_s`` seconds; handle deaths."""
        self._ready.extend(self._engine.poll(wait_s, self._check_death))

    def _process(self, task: _Task) -> Any:
        self._workers_num_tasks[task.worker_id] -= 1
        self._try_put_index()
        reply = task.reply
        if isinstance(reply, Failed):
            raise self._engine.failure(task.record, reply)
        assert reply is not None
        data = self._engine.result(task.record, reply)
        self.positions.handout(task.worker_id, task.record.after)
        if self.position is not None:
            self.positions.fold(self.position.yielded)  # keeps only what the user has not received
        if self.order_log is not None:
            self.order_log.append(task.pull)
        if self.on_yield is not None:
            self.on_yield.yielded += 1
        if self._pin_memory and not self._engine.page_locked:
            # The user copies: into torch's pinned memory, whose allocator records the stream of
            # each copy made from it (docs/design/cuda-feed.md, "pin_memory=True"). Page-locked
            # slots are read by the CUDA feed only, which pins an overflowed payload itself.
            data = torch_pin_memory(data, self._pin_memory_device)  # type: ignore[no-untyped-call]
        return data

    # -- faults -----------------------------------------------------------------------------
    def _check_death(self, death: WorkerDeath) -> None:
        """torch's rule, before the engine replaces a dead worker: an IterableDataset's position
        cannot be replayed."""
        if self._is_iterable and (death.tasks or self._workers_status[death.worker_id]):
            self.close()
            raise WorkerError(
                f"{death.where} while loading from an IterableDataset. Its position in the stream cannot be "
                f"replayed, so the epoch cannot complete exactly once. In flight: {death.in_flight}. "
                "Fix the cause of the crash (memory: fewer workers or smaller batches)."
            )

    def _timeout_error(self, timeout_s: float) -> LoaderTimeoutError:
        task = self._task_info.get(self._rcvd_idx)
        detail = ""
        if task is not None:
            detail = (
                f" Waiting for batch {self._rcvd_idx} (sample indices {task.index!r}) from worker "
                f"{task.worker_id} (pid {self._engine.pid(task.worker_id)}), which is alive but slow."
            )
        return LoaderTimeoutError(
            f"DataLoader timed out after {timeout_s} seconds.{detail} Raise `timeout` if batches "
            "legitimately take longer, or 0 to wait forever."
        )


def _sharding_init(init_fn: Callable[[int], None] | None, world_size: int, rank: int) -> Callable[[int], None]:
    import functools

    return functools.partial(_sharding_worker_init_fn, init_fn, world_size, rank)
