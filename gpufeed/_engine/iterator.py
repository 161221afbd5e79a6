"""One pass over a FastLoader with ``num_workers > 0``: dispatch, in-order reassembly, timeouts,
worker replacement, and re-raising worker errors.

The dispatch policy (which worker gets which batch, how many are in flight, what ``in_order``
does, how exhausted IterableDataset workers are skipped) is torch's own, decision for decision,
so per-worker random streams see the same samples as under ``torch.utils.data.DataLoader``.
The sampler, base seed and length checks come from torch's ``_BaseDataLoaderIter`` itself.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset, IterDataPipe, MapDataPipe
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter, _sharding_worker_init_fn

from gpufeed._engine.ledger import SlotLedger
from gpufeed._engine.pool import WorkerPool, describe_exit
from gpufeed._engine.transport import unpack
from gpufeed._engine.worker import WorkerException, WorkerSpec
from gpufeed.errors import LoaderTimeoutError, WorkerError, add_note
from gpufeed.stats import Stats

if TYPE_CHECKING:
    from gpufeed.loader import FastLoader

log = logging.getLogger(__name__)
IDLE_TRIM_S = 0.01  # a consumer that waited this long for data: warm slots waiting are surplus


@dataclass
class _Task:
    worker_id: int
    idx: int
    slot: int  # the fallback slot (cold), or the one the parent wrote cache hits into
    index: Any
    extra: Any = None  # ImageTask on the image path
    reply: Any = None  # the worker's message once it arrived
    swap: bool = True  # the worker may write a warm slot instead (see gpufeed._engine.arena)


def _shutdown(pool: WorkerPool, ledger: SlotLedger) -> None:
    """Finalizer: stop workers, then give their slots back (nobody writes them any more).

    The iterator detaches from the arena however this ends, or the loader's close would keep the
    memfd open. If stopping the workers raised (Ctrl-C during the join), one may still be writing:
    its slots stay held until the arena closes, rather than be handed out again under a writer.
    """
    if pool.closed or not pool.owned_here:
        return
    try:
        unread = pool.shutdown()
    except BaseException:
        ledger.arena.detach()
        raise
    try:
        for _, msg in unread:
            if msg[0] == "claim":  # the task a worker was running when told to stop took a warm slot
                ledger.claim((msg[1], msg[2]), msg[3])
        ledger.release_all()
    finally:
        ledger.arena.detach()


class FastIter(_BaseDataLoaderIter):
    """Iterator of a FastLoader with workers; persistent workers reuse it across epochs."""

    def __init__(self, loader: FastLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._prefetch_factor <= 0:  # torch accepts 0 at construction and fails here, so do we
            raise AssertionError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._config = loader.engine_config
        self._stats: Stats = loader._stats
        self._arena = loader._get_arena()
        self._registrar = loader._registrar  # page-locks slots when CUDA will read them
        self._feed = loader._image_feed
        # With a cache the parent writes the hits into a task's slot when it dispatches it, so
        # that slot is bound at once; otherwise workers bind slots late (see gpufeed._engine.arena).
        self._parent_binds = self._feed is not None and self._feed.cache is not None
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        init_fn = loader.worker_init_fn
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):
            init_fn = _sharding_init(init_fn, self._world_size, self._rank)
        spec = WorkerSpec(
            dataset=self._dataset,
            is_iterable=isinstance(self._dataset, IterableDataset),
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            base_seed=self._base_seed,
            worker_init_fn=init_fn,
            worker_id=0,
            num_workers=self._num_workers,
            shared_seed=self._shared_seed,
            arena=self._arena.handle(),
            parent_pid=os.getpid(),
            inherited_fds=(),
            image_plan=None if self._feed is None else self._feed.plan,
            pin_cpus=loader._pin_cpus(),
            log_dir=loader.log_dir,
        )
        self._is_iterable = spec.is_iterable
        self._ledger = SlotLedger(self._arena, self._num_workers)
        self._restarts = 0
        self._epoch = 0
        self._arena.attach()
        try:
            self._pool = WorkerPool(ctx, spec, self._num_workers, self._config.shutdown_timeout_s)
        except BaseException:
            self._arena.detach()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._ledger)
        loader._live_iters.add(self)
        self._reset(loader, first_iter=True)

    # -- public introspection -------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes (for monitoring and fault tests)."""
        return self._pool.pids

    @property
    def worker_restarts(self) -> int:
        return self._restarts

    def close(self) -> None:
        """Stop the workers and release their slots now (idempotent)."""
        self._finalizer()

    # -- epoch set-up -----------------------------------------------------------------------
    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._aug_epoch = loader._begin_epoch()
        if self._pool.closed:
            raise RuntimeError("gpufeed: this iterator's workers were shut down (loader closed)")
        if not first_iter:
            old = self._epoch
            self._epoch += 1
            for worker_id in range(self._num_workers):
                self._pool.send(worker_id, ("reset", self._epoch))
            for idx, _ in self._ready:  # answered, never looked at
                self._ledger.release((old, idx))
            for idx, task in self._task_info.items():
                # Answered but never yielded: drop now. Unanswered: dropped when the stale reply
                # comes, unless the worker had ended (it will never reply to this epoch).
                if task.reply is not None or not self._workers_status[task.worker_id]:
                    self._ledger.answered((old, idx), task.worker_id)
                    self._ledger.release((old, idx))
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, _Task] = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        self._ready: list[tuple[int, Any]] = []  # (task index, reply) not yet looked at, in arrival order
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    # -- dispatch (torch's policy) ----------------------------------------------------------
    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        task_idx = self._send_idx
        slot = self._ledger.take((self._epoch, task_idx), worker_id, warm=self._parent_binds)
        task = self._task_info[task_idx] = _Task(worker_id, task_idx, slot, index, self._prepare(slot, index),
                                                 swap=not self._parent_binds)
        self._send(task)
        self._workers_num_tasks[worker_id] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _prepare(self, slot: int, index: Any, count: bool = True) -> Any:
        if self._feed is None:
            return None
        return self._feed.prepare(self._aug_epoch, index, self._arena.slot_tensor(slot), count)

    def _send(self, task: _Task) -> None:
        self._pool.send(task.worker_id, ("task", self._epoch, task.idx, task.slot, task.index, task.extra, task.swap))

    # -- receiving --------------------------------------------------------------------------
    def _next_data(self) -> Any:
        t_start = time.perf_counter()
        self._arena.free_copied()  # page-locked slots whose user copies have run
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
                    self._ledger.answered((self._epoch, self._rcvd_idx), task.worker_id)
                    self._ledger.release((self._epoch, self._rcvd_idx))
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self.close()
                raise StopIteration

            task = self._task_info[self._rcvd_idx]
            if task.reply is not None:
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(task)

            task_idx, reply = self._get_reply()
            self._tasks_outstanding -= 1
            task = self._task_info[task_idx]
            if reply[0] == "end":  # like torch: the task stays unanswered and is skipped above
                self._workers_status[task.worker_id] = False
                self._try_put_index()
                continue
            task.reply = reply
            if task_idx != self._rcvd_idx:
                if not self._in_order:
                    del self._task_info[task_idx]
                    return self._process(task)
                continue  # keep it for its turn
            del self._task_info[task_idx]
            self._rcvd_idx += 1
            return self._process(task)

    def _get_reply(self) -> tuple[int, Any]:
        """(task index, reply) of the next answered current-epoch task; handles deaths and timeouts."""
        timeout_s = self._timeout
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        trim = not self._parent_binds
        while not self._ready:
            wait_s = self._config.liveness_interval_s
            if trim:
                wait_s = min(wait_s, IDLE_TRIM_S)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout_error(timeout_s)
                wait_s = min(wait_s, remaining)
            self._poll(wait_s)
            if trim and not self._ready:
                self._arena.trim_waiting()  # the loader is the bottleneck: idle warm slots are surplus
                trim = False
        return self._ready.pop(0)

    def _poll(self, wait_s: float) -> None:
        """Take in what the workers sent within ``wait_s`` seconds; handle deaths."""
        messages, dead = self._pool.wait(wait_s)
        # Replies first: a worker that answered and then died must not re-run that task.
        for i, (worker_id, msg) in enumerate(messages):
            try:
                self._accept(worker_id, msg)
            except BaseException:
                # (e.g. worker_init_fn raised) The messages read with it are gone from the pipes;
                # claims among them name warm slots other workers took, which must be freed.
                for _, later in messages[i + 1 :]:
                    if later[0] == "claim":
                        self._ledger.claim((later[1], later[2]), later[3])
                raise
        for worker_id in dead:
            self._on_death(worker_id)

    def _accept(self, worker_id: int, msg: Any) -> None:
        kind = msg[0]
        if kind == "init_err":
            self.close()
            exc = msg[1].rebuild()
            add_note(exc, f"gpufeed: raised in worker_init_fn of worker {worker_id}.\n{msg[1].traceback}")
            raise exc
        epoch, task_idx = msg[1], msg[2]
        if kind == "claim":
            self._ledger.claim((epoch, task_idx), msg[3])
            return
        if not self._ledger.answered((epoch, task_idx), worker_id):
            return  # a duplicate (worker died after replying) or a dropped task
        if epoch != self._epoch:  # a batch of an abandoned epoch
            self._ledger.release((epoch, task_idx))
            return
        self._ledger.settle((epoch, task_idx))
        if kind == "ok":
            report = msg[9]
            task = self._task_info[task_idx]
            samples = len(report.kept) if report is not None else _num_samples(task.index)
            self._stats.add_batch(samples=samples, fetch_s=msg[6], collate_s=msg[7], pack_s=msg[8], report=report)
        else:
            self._stats.errors += kind == "err"
        self._ready.append((task_idx, msg))

    def _process(self, task: _Task) -> Any:
        self._workers_num_tasks[task.worker_id] -= 1
        self._try_put_index()
        reply = task.reply
        key = (self._epoch, task.idx)
        if reply[0] == "err":
            self._ledger.release(key)
            err: WorkerException = reply[3]
            exc = err.rebuild()
            add_note(
                exc,
                f"gpufeed: raised in worker {task.worker_id} (pid {self._pool.pid(task.worker_id)}) "
                f"while loading sample indices {task.index!r}.\nWorker traceback:\n{err.traceback}",
            )
            raise exc
        _, _, _, skeleton, used, overflow = reply[:6]
        if overflow:
            self._stats.overflow_bytes += overflow
        slot = self._ledger.slot(key)
        if self._feed is not None:
            self._feed.absorb(task.index, task.extra, reply[9], self._arena.slot_tensor(slot))
        if self._registrar is not None:
            self._registrar.ensure(slot, used)  # once per slot extent, never per batch
        lease = self._ledger.lease(key, used)
        data = unpack(skeleton, lease)
        del lease  # the slot returns to the free list when the batch's last view dies
        if self._pin_memory and (self._registrar is None or overflow):
            data = torch_pin_memory(data, self._pin_memory_device)
        return data

    # -- faults -----------------------------------------------------------------------------
    def _on_death(self, worker_id: int) -> None:
        pid, exitcode = self._pool.pid(worker_id), self._pool.exitcode(worker_id)
        how = describe_exit(exitcode)
        owed = self._ledger.unanswered[worker_id]
        current = sorted(idx for (ep, idx) in owed if ep == self._epoch)
        for key in [k for k in owed if k[0] != self._epoch]:  # stale epochs: nobody waits for them
            self._ledger.answered(key, worker_id)
            self._ledger.release(key)
        batches = ", ".join(f"batch {i} (indices {self._task_info[i].index!r})" for i in current[:3])
        where = f"gpufeed worker {worker_id} (pid {pid}) {how}"
        if self._is_iterable and (current or self._workers_status[worker_id]):
            self.close()
            raise WorkerError(
                f"{where} while loading from an IterableDataset. Its position in the stream cannot be "
                f"replayed, so the epoch cannot complete exactly once. In flight: {batches or 'nothing'}. "
                "Fix the cause of the crash (memory: fewer workers or smaller batches)."
            )
        if self._restarts >= self._config.max_worker_restarts:
            self.close()
            raise WorkerError(
                f"{where}; {self._restarts} worker(s) were already replaced in this iterator, the limit "
                f"set by max_worker_restarts={self._config.max_worker_restarts}. In flight: "
                f"{batches or 'nothing'}. Fix the crash, or raise max_worker_restarts."
            )
        self._restarts += 1
        self._stats.worker_restarts += 1
        new_pid = self._pool.replace(worker_id)
        log.warning("%s; replaced by pid %d, re-running %d batch(es)", where, new_pid, len(current))
        for idx in current:
            self._ledger.drop_claim((self._epoch, idx))
            task = self._task_info[idx]
            task.extra = self._prepare(task.slot, task.index, count=False)  # rows may have moved
            self._send(task)

    def _timeout_error(self, timeout_s: float) -> LoaderTimeoutError:
        task = self._task_info.get(self._rcvd_idx)
        detail = ""
        if task is not None:
            detail = (
                f" Waiting for batch {self._rcvd_idx} (sample indices {task.index!r}) from worker "
                f"{task.worker_id} (pid {self._pool.pid(task.worker_id)}), which is alive but slow."
            )
        return LoaderTimeoutError(
            f"DataLoader timed out after {timeout_s} seconds.{detail} Raise `timeout` if batches "
            "legitimately take longer, or 0 to wait forever."
        )


def _num_samples(index: Any) -> int:
    """Samples in a task: the batch's length, 1 without auto-collation."""
    try:
        return len(index)
    except TypeError:
        return 1


def _sharding_init(init_fn: Any, world_size: int, rank: int) -> Any:
    import functools

    return functools.partial(_sharding_worker_init_fn, init_fn, world_size, rank)
