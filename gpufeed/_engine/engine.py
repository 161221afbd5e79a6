"""The engine: worker processes turning a stream of tasks into batches in the arena.

It knows nothing of samplers, DataLoader or images. A driver submits tasks (``submit``) and
takes in their replies (``poll`` / ``wait``), in arrival order; the engine does the rest:

* starts the workers (``WorkerPool``; with ``lazy_workers``, each at its first task) and sends
  each task, with a cold fallback slot from the ``SlotLedger`` (or a slot the plug-in wrote
  into, when it binds slots);
* lets the plug-in complete a task in the parent (``FillPlugin.look_up`` at submission,
  ``complete`` when it is handed out, in the slot freed last: no worker involved); its reply is
  queued and comes out of ``poll``/``wait`` first, like any other;
* reads the typed replies: claims of warm slots go to the ledger, replies of an abandoned pass
  free their slots, ``InitFailed`` stops everything and raises the worker's exception;
* on a worker death: takes in what the worker sent before dying (a task that was answered is
  never re-run), asks the driver's death policy, then starts a replacement with the same id and
  seed and re-sends the dead worker's unanswered tasks in order (bounded by
  ``max_worker_restarts``); a task that killed its worker more than ``max_task_retries`` times
  (a driver's choice; FastIter re-sends always) is answered ``Failed`` instead;
* hands a batch out (``result``: a view of its slot, freed when the user's last reference
  dies), turns a failure into the worker's exception (``failure``), or drops a task
  (``drop``);
* shuts down (``close``, or the finalizer when the engine is garbage collected).

``FastIter`` drives it with torch's sampler policy; anything else (a request stream) can drive
it the same way. See docs/design/engine-lifecycle.md.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from typing import Any

from gpufeed._engine.arena import Arena
from gpufeed._engine.context import EngineContext
from gpufeed._engine.ledger import SlotLedger
from gpufeed._engine.messages import (
    Claim,
    Done,
    End,
    Failed,
    FromWorker,
    InitFailed,
    Reset,
    Restore,
    Task,
    WorkerException,
)
from gpufeed._engine.plugin import LookUp
from gpufeed._engine.pool import WorkerPool, describe_exit
from gpufeed._engine.transport import pack_views, unpack
from gpufeed._engine.worker import WorkerSpec
from gpufeed.errors import WorkerError, add_note

log = logging.getLogger(__name__)
# A consumer that has waited this many of a worker's task times for data (and at least
# IDLE_TRIM_MIN_S): the loader stalled, and warm slots waiting are not needed soon.
IDLE_TRIM_TASKS = 2.0
IDLE_TRIM_MIN_S = 0.1
MAX_SKELETONS = 16  # layouts of parent-made batches whose packed skeleton is kept
TASK_S_WEIGHT = 0.25  # weight of the newest task in the running mean of a worker's task time

TaskKey = tuple[int, int]  # (epoch, idx)
NO_SLOT = -1  # TaskRecord.slot of a task the plug-in completes in the parent: bound when handed out


@dataclass(slots=True)
class TaskRecord:
    """A submitted task, as the engine keeps it until it is answered (and re-sends it if its
    worker dies)."""

    epoch: int
    idx: int
    worker_id: int
    slot: int  # the fallback slot (cold), the one the plug-in wrote into, or NO_SLOT (made in ``result``)
    index: Any
    extra: Any  # the plug-in's per-task data (Task.extra)
    tag: Any  # the driver's value for the plug-in's prepare (FastIter: a PassTag)
    swap: bool  # the worker may write a warm slot instead (see gpufeed._engine.arena)
    deaths: int = 0  # workers that died while running this task (not while it was queued)
    # With state tracking: (the worker's random states, its dataset's state) after this task, as
    # its reply said (the random states resolved: a reply sends them only when they changed).
    after: tuple[Any, Any] | None = None
    parent_s: float = 0.0  # a task the plug-in completes: seconds of its look-up at submission

    @property
    def key(self) -> TaskKey:
        return (self.epoch, self.idx)


Arrival = tuple[TaskRecord, Done | Failed | End]


@dataclass(frozen=True)
class WorkerDeath:
    """What a driver's death policy is told before the engine replaces a dead worker."""

    worker_id: int
    pid: int
    where: str  # "gpufeed worker 1 (pid 123) killed by SIGKILL"
    tasks: list[TaskRecord]  # its unanswered tasks of the current epoch, in order

    @property
    def in_flight(self) -> str:
        """The first three of those tasks, for an error message."""
        listed = ", ".join(f"batch {t.idx} (indices {t.index!r})" for t in self.tasks[:3])
        return listed or "nothing"


DeathPolicy = Callable[[WorkerDeath], None]  # raises to stop instead of replacing the worker


def _shutdown(pool: WorkerPool, ledger: SlotLedger) -> None:
    """Finalizer: stop workers, then give their slots back (nobody writes them any more).

    The engine detaches from the arena however this ends, or the loader's close would keep the
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
            if isinstance(msg, Claim):  # the task a worker was running when told to stop took a warm slot
                ledger.claim((msg.epoch, msg.idx), msg.slot)
        ledger.release_all()
    finally:
        ledger.arena.detach()


class Engine:
    """Worker processes and the tasks they owe, for one driver (an iterator, a request stream).

    ``spec`` says what workers run (dataset, collate, seeds, worker_init_fn); the engine fills
    in the arena, the plug-in's filler, CPU pinning and the log directory from ``context``.
    ``tasks_in_flight``: how many tasks the driver keeps submitted at most (sizes the arena's
    warm-slot cap when the plug-in binds slots). ``max_task_retries``: how many times a task
    whose worker died while running it is re-sent; once more, it is answered with ``Failed`` (a
    ``WorkerError`` naming the deaths) instead. Tasks queued behind it are not blamed and are
    always re-sent. None (FastIter): always re-sent, every sample exactly once.
    ``lazy_workers``: start each worker at its first task instead of now (a driver whose plug-in
    may complete every task in the parent, so that a pass that needs no worker starts none; a
    latency-bound driver keeps them eager). ``clock``: monotonic seconds, for the waits' deadlines
    and the restart window (a test passes a manual clock, e.g. ``gpufeed.serve._clock.ManualClock.now``).
    """

    def __init__(
        self,
        context: EngineContext,
        spec: WorkerSpec,
        num_workers: int,
        *,
        mp_context: BaseContext | None = None,
        tasks_in_flight: int = 0,
        max_task_retries: int | None = None,
        lazy_workers: bool = False,
        restart_window_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"`num_workers` must be >= 1 for the engine. Found: {num_workers}.")
        if restart_window_s is not None and not restart_window_s > 0:
            raise ValueError(f"`restart_window_s` must be > 0 seconds or None. Found: {restart_window_s}.")
        self._context = context
        self._clock = clock
        self._stats = context.stats
        self._config = context.config
        self._plugin = context.plugin
        # When the plug-in writes into a task's slot at submission (cache hits), that slot is
        # bound at once; otherwise workers bind slots late (see gpufeed._engine.arena).
        self.parent_binds = self._plugin is not None and self._plugin.parent_binds
        # Warm slots allowed to wait in the arena's pipe: one per worker, plus one, when workers
        # take them; when the parent binds, as many as the tasks it keeps in flight.
        warm_cap = tasks_in_flight + 2 if self.parent_binds else num_workers + 1
        self._arena = context.arena(warm_cap)
        self._registrar = context.registrar  # page-locks slots when CUDA will read them
        spec = replace(
            spec,
            num_workers=num_workers,
            arena=self._arena.handle(),
            parent_pid=os.getpid(),
            filler=None if self._plugin is None else self._plugin.filler,
            pin_cpus=context.pin_cpus(),
            log_dir=context.log_dir,
        )
        self.num_workers = num_workers
        self.max_task_retries = max_task_retries
        self.epoch = 0
        self._next_idx = 0
        self._restarts = 0
        # With a window (a long-lived driver such as a server), max_worker_restarts bounds the
        # replacements within any restart_window_s seconds, not over the engine's whole life.
        self.restart_window_s = restart_window_s
        self._restart_times: deque[float] = deque()
        self._records: dict[TaskKey, TaskRecord] = {}  # the unanswered tasks (the ledger's keys)
        self._track = spec.track_rng or spec.track_dataset
        self._rng: list[Any] = [None] * num_workers  # each worker's random states, as last sent
        self._restores: dict[int, Restore] = {}  # for workers not started yet (lazy)
        self._completed: deque[Arrival] = deque()  # tasks the plug-in completed, not polled yet
        self._skeletons = context.skeletons  # parent-made batches' packed skeletons by layout
        self.task_s: float | None = None  # running mean of a worker's seconds per task (None: no reply yet)
        self._ledger = SlotLedger(self._arena, num_workers)
        self._arena.attach()
        try:
            self._pool = WorkerPool(
                mp_context or multiprocessing.get_context(),
                spec,
                num_workers,
                self._config.shutdown_timeout_s,
                fork_guard=context.fork_guard,
                lazy=lazy_workers,
            )
        except BaseException:
            self._arena.detach()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._ledger)
        context.engines.add(self)

    # -- introspection ----------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        """Pids of the live worker processes."""
        return self._pool.pids

    def pid(self, worker_id: int) -> int:
        return self._pool.pid(worker_id)

    @property
    def workers_started(self) -> int:
        """Worker processes started so far (replacements included)."""
        return self._pool.started

    @property
    def restarts(self) -> int:
        """Dead workers replaced so far."""
        return self._restarts

    @property
    def closed(self) -> bool:
        return self._pool.closed

    @property
    def page_locked(self) -> bool:
        """Slots are page-locked for CUDA before they are handed out."""
        return self._registrar is not None

    @property
    def arena(self) -> Arena:
        return self._arena

    def owed(self, worker_id: int) -> int:
        """Tasks ``worker_id`` has not answered yet (all epochs)."""
        return len(self._ledger.unanswered[worker_id])

    # -- tasks ------------------------------------------------------------------------------
    def submit(self, index: Any, *, worker_id: int | None = None, tag: Any = None) -> TaskRecord:
        """Send a task for ``index`` to ``worker_id`` (default: the worker that owes fewest).

        ``tag`` is passed to the plug-in's ``prepare`` (and again if the task is re-sent).
        Returns the task's record; its reply comes out of ``poll``/``wait``.
        """
        if self._pool.closed:
            raise RuntimeError("gpufeed: the workers were shut down (close(), or the loader was closed)")
        if worker_id is None:
            worker_id = min(range(self.num_workers), key=self.owed)
        idx = self._next_idx
        key = (self.epoch, idx)
        self._next_idx += 1
        t0 = time.perf_counter()
        found = self._look_up(tag, index)
        if found is not None and found.report is not None:
            # Made by the plug-in in the parent when it is handed out (``result``), in the slot
            # freed last; no worker owes it, so a death never re-runs it.
            record = TaskRecord(self.epoch, idx, worker_id, NO_SLOT, index, found.extra, tag, swap=False,
                                parent_s=time.perf_counter() - t0)
            self._completed.append((record, Done(epoch=self.epoch, idx=idx, skeleton=b"", used_bytes=0,
                                                 overflow_bytes=0, fetch_s=0.0, collate_s=0.0, pack_s=0.0,
                                                 report=found.report)))
            return record
        # A task whose slot the parent writes now (cache hits) takes a warm slot at once; one it
        # writes nothing into (no look-up hits) waits with a cold fallback, which its worker may
        # swap for a warm slot as it starts: a queued task then holds no pages.
        binds = self.parent_binds and (found is None or found.writes)
        slot = self._ledger.take(key, worker_id, warm=binds)
        record = self._records[key] = TaskRecord(
            self.epoch, idx, worker_id, slot, index, None, tag, swap=not binds)
        try:
            record.extra = self._prepare(record, count=True, found=None if found is None else found.extra)
        except BaseException:
            self._forget(key, worker_id)
            raise
        self._send(record)
        return record

    def _look_up(self, tag: Any, index: Any) -> LookUp | None:
        """The plug-in's look-up at submission (``FillPlugin.look_up``), or None without a plug-in."""
        return None if self._plugin is None else self._plugin.look_up(tag, index, True)

    def _forget(self, key: TaskKey, worker_id: int) -> None:
        """The task is owed no more (a reply that still comes is ignored) and its slot is freed."""
        self._ledger.answered(key, worker_id)
        self._records.pop(key, None)
        self._ledger.release(key)

    def _make_here(self, record: TaskRecord) -> tuple[Done, Any]:
        """Make a task the plug-in completes in the parent: bind a slot now (the one freed last:
        its pages are warm and often still in the CPU caches), let the plug-in write the batch
        there, and pack its views as a worker's reply; returns the reply and the slot's view."""
        t0 = time.perf_counter()
        key = record.key
        slot = self._ledger.bind(key)
        try:
            slot_view = self._arena.slot_tensor(slot)
            if self._plugin is None:  # a record is NO_SLOT only when a plug-in's look-up said so
                raise RuntimeError("gpufeed: a task to complete in the parent, without a plug-in")
            made = self._plugin.complete(record.index, record.extra, slot_view)
            report, layout = made.report, made.layout
            t1 = time.perf_counter()
            packed = None if layout is None else self._skeletons.get(layout)
            if packed is None:
                packed = pack_views(made.batch, slot_view)
                if layout is not None and packed[2] == 0:  # nothing went inline: the same for every batch
                    if len(self._skeletons) >= MAX_SKELETONS:
                        self._skeletons.clear()
                    self._skeletons[layout] = packed
        except BaseException:
            self._ledger.release(key)
            raise
        skeleton, used, overflow = packed
        now = time.perf_counter()
        samples = report.samples if report is not None else _num_samples(record.index)
        self._stats.add_parent_batch(samples=samples, seconds=record.parent_s + now - t0)
        return Done(epoch=record.epoch, idx=record.idx, skeleton=skeleton, used_bytes=used,
                    overflow_bytes=overflow, fetch_s=0.0, collate_s=0.0, pack_s=now - t1, report=report), slot_view

    def new_epoch(self) -> None:
        """Start a new pass: workers get ``Reset`` (a fresh IterableDataset iterator), task
        numbers start again at 0, and replies of the old pass free their slots as they come."""
        self.epoch += 1
        self._next_idx = 0
        while self._completed:  # completed in the parent, never polled: nobody will read them
            self._ledger.release(self._completed.popleft()[0].key)
        for worker_id in range(self.num_workers):
            if self._pool.is_started(worker_id):  # one started later begins with a fresh iterator
                self._pool.send(worker_id, Reset(epoch=self.epoch))

    def restore(self, worker_id: int, msg: Restore) -> None:
        """Send ``msg`` to ``worker_id`` before any later task (a lazy worker gets it when it
        starts): a resumed pass's random and dataset states (docs/design/resume.md)."""
        if self._pool.is_started(worker_id):
            self._send_restore(worker_id, msg)
        else:
            self._restores[worker_id] = msg

    def _send_restore(self, worker_id: int, msg: Restore) -> None:
        if msg.rng is not None:
            self._rng[worker_id] = msg.rng  # what the worker's next replies are relative to
        self._pool.send(worker_id, msg)

    def _prepare(self, record: TaskRecord, count: bool, found: Any = None) -> Any:
        """The plug-in's ``prepare`` for a task sent to a worker (``found``: what its look-up at
        submission found, None when it is prepared again after a death)."""
        if self._plugin is None:
            return None
        slot_view = self._arena.slot_tensor(record.slot)
        if found is None:
            return self._plugin.prepare(record.tag, record.index, slot_view, count)
        return self._plugin.prepare(record.tag, record.index, slot_view, count, found)

    def _send(self, record: TaskRecord) -> None:
        task = Task(epoch=record.epoch, idx=record.idx, slot=record.slot, index=record.index,
                    extra=record.extra, swap=record.swap)
        try:
            self._pool.ensure(record.worker_id)  # a lazy pool starts the worker at its first task
        except BaseException:
            self.close()  # e.g. an unpicklable dataset under spawn: stop the workers started
            raise
        restore = self._restores.pop(record.worker_id, None)
        if restore is not None:
            self._send_restore(record.worker_id, restore)
        self._pool.send(record.worker_id, task)

    # -- replies ----------------------------------------------------------------------------
    def poll(self, wait_s: float, on_death: DeathPolicy | None = None) -> list[Arrival]:
        """Take in what the workers sent within ``wait_s`` seconds; handle deaths.

        Returns the replies of current-epoch tasks, in arrival order, each with its record (the
        tasks the plug-in completed first, in submission order, without waiting).
        ``on_death`` may raise to stop instead of replacing a dead worker.
        """
        arrived: list[Arrival] = list(self._completed)
        self._completed.clear()
        messages, dead = self._pool.wait(0.0 if arrived else wait_s)
        # Replies first: a worker that answered and then died must not re-run that task.
        for i, (worker_id, msg) in enumerate(messages):
            try:
                self._accept(worker_id, msg, arrived)
            except BaseException:
                # (e.g. worker_init_fn raised) The messages read with it are gone from the pipes;
                # claims among them name warm slots other workers took, which must be freed.
                for _, later in messages[i + 1 :]:
                    if isinstance(later, Claim):
                        self._ledger.claim((later.epoch, later.idx), later.slot)
                raise
        for worker_id in dead:
            arrived += self._on_death(worker_id, on_death)
        return arrived

    def wait(self, timeout_s: float | None, on_death: DeathPolicy | None = None) -> list[Arrival]:
        """Block until at least one reply arrived (or ``timeout_s`` passed: then []).

        Deaths are noticed every ``liveness_interval_s``. A wait longer than ``IDLE_TRIM_TASKS``
        times a worker's task time (``task_s``; at least ``IDLE_TRIM_MIN_S``) empties the warm
        slots waiting in the arena: the loader is stalled or idle, not merely between two
        batches (never before the first reply, nor when the plug-in binds slots; see
        docs/design/engine-lifecycle.md, "Trimming").
        """
        now = self._clock()
        deadline = None if timeout_s is None else now + timeout_s
        trim_at = None
        if not self.parent_binds and self.task_s is not None:
            trim_at = now + max(IDLE_TRIM_MIN_S, IDLE_TRIM_TASKS * self.task_s)
        while True:
            now = self._clock()
            wait_s = self._config.liveness_interval_s
            if trim_at is not None:
                wait_s = min(wait_s, max(0.0, trim_at - now))
            if deadline is not None:
                remaining = deadline - now
                if remaining <= 0:
                    return []
                wait_s = min(wait_s, remaining)
            arrived = self.poll(wait_s, on_death)
            if arrived:
                return arrived
            if trim_at is not None and self._clock() >= trim_at:
                self._arena.trim_waiting()  # stalled: the slots waiting are not needed soon
                trim_at = None

    def _accept(self, worker_id: int, msg: FromWorker, arrived: list[Arrival]) -> None:
        if isinstance(msg, InitFailed):
            self.close()
            exc = msg.error.rebuild()
            add_note(exc, f"gpufeed: raised in worker_init_fn of worker {worker_id}.\n{msg.error.traceback}")
            raise exc
        key = (msg.epoch, msg.idx)
        if isinstance(msg, Claim):
            self._ledger.claim(key, msg.slot)
            return
        if isinstance(msg, Done) and msg.rng is not None:
            self._rng[worker_id] = msg.rng  # the worker's states, whether this reply is read or not
        if not self._ledger.answered(key, worker_id):
            return  # a duplicate (worker died after replying) or a dropped task
        record = self._records.pop(key)
        if msg.epoch != self.epoch:  # a batch of an abandoned epoch
            self._ledger.release(key)
            return
        self._ledger.settle(key)
        if isinstance(msg, Done):
            took_s = msg.fetch_s + msg.collate_s + msg.pack_s
            self.task_s = took_s if self.task_s is None else self.task_s + TASK_S_WEIGHT * (took_s - self.task_s)
            if self._track:
                record.after = (self._rng[worker_id], msg.dataset_state)
            report = msg.report
            samples = report.samples if report is not None else _num_samples(record.index)
            self._stats.add_batch(samples=samples, fetch_s=msg.fetch_s, collate_s=msg.collate_s,
                                  pack_s=msg.pack_s, report=report)
        elif isinstance(msg, Failed):
            self._stats.errors += 1
        arrived.append((record, msg))

    def result(self, record: TaskRecord, reply: Done) -> Any:
        """The batch of an answered task: views of its slot, which is freed when the last of
        them dies (the engine keeps no reference)."""
        key = record.key
        slot_view = None
        if record.slot == NO_SLOT:  # the plug-in completes it here and now
            reply, slot_view = self._make_here(record)
        if reply.overflow_bytes:
            self._stats.overflow_bytes += reply.overflow_bytes
        slot = self._ledger.slot(key)
        if self._plugin is not None:
            if slot_view is None:
                slot_view = self._arena.slot_tensor(slot)
            self._plugin.absorb(record.index, record.extra, reply.report, slot_view)
        if self._registrar is not None:
            self._registrar.ensure(slot, reply.used_bytes)  # once per slot extent, never per batch
        lease = self._ledger.lease(key, reply.used_bytes)
        data = unpack(reply.skeleton, lease)
        del lease  # the slot returns to the free list when the batch's last view dies
        return data

    def failure(self, record: TaskRecord, reply: Failed) -> BaseException:
        """The exception of a failed task, with a note naming the worker and the indices; the
        task's slot is freed."""
        self._ledger.release(record.key)
        err = reply.error
        exc = err.rebuild()
        add_note(
            exc,
            f"gpufeed: raised in worker {record.worker_id} (pid {self._pool.pid(record.worker_id)}) "
            f"while loading sample indices {record.index!r}.\nWorker traceback:\n{err.traceback}",
        )
        return exc

    def drop(self, record: TaskRecord) -> None:
        """The driver will not read this task: it is owed no more (a reply that still comes is
        ignored) and its slot is freed. Only for a task that was answered, or whose worker will
        never answer it (it ended its epoch): a worker may still be writing an unanswered one."""
        self._forget(record.key, record.worker_id)

    # -- faults -----------------------------------------------------------------------------
    def _on_death(self, worker_id: int, on_death: DeathPolicy | None) -> list[Arrival]:
        """Replace the dead worker and re-send what it owed; returns the tasks given up instead
        (past ``max_task_retries``), answered with ``Failed``."""
        pid, exitcode = self._pool.pid(worker_id), self._pool.exitcode(worker_id)
        owed = self._ledger.unanswered[worker_id]
        current = sorted(idx for (ep, idx) in owed if ep == self.epoch)
        for key in [k for k in owed if k[0] != self.epoch]:  # stale epochs: nobody waits for them
            self._forget(key, worker_id)
        death = WorkerDeath(worker_id, pid, f"gpufeed worker {worker_id} (pid {pid}) {describe_exit(exitcode)}",
                            [self._records[(self.epoch, idx)] for idx in current])
        if on_death is not None:
            on_death(death)
        limit = self._config.max_worker_restarts
        now = self._clock()
        window = self.restart_window_s
        while window is not None and self._restart_times and self._restart_times[0] <= now - window:
            self._restart_times.popleft()
        if len(self._restart_times) >= limit:
            self.close()
            span = "in this iterator" if window is None else f"in the last {window:g} s"
            raise WorkerError(
                f"{death.where}; {len(self._restart_times)} worker(s) were already replaced {span}, the limit "
                f"set by max_worker_restarts={limit}. In flight: "
                f"{death.in_flight}. Fix the crash, or raise max_worker_restarts."
            )
        self._restart_times.append(now)
        self._restarts += 1
        self._stats.worker_restarts += 1
        new_pid = self._pool.replace(worker_id)
        self._rng[worker_id] = None  # the replacement's random states are those of its set-up
        given_up: list[Arrival] = []
        for position, record in enumerate(death.tasks):
            self._ledger.drop_claim(record.key)
            # A worker runs its tasks in order: the death is blamed on the oldest one it owed
            # (the one it was running), not on those queued behind it.
            if position == 0:
                record.deaths += 1
            if position == 0 and self.max_task_retries is not None and record.deaths > self.max_task_retries:
                given_up.append((record, self._give_up(record, death)))
                continue
            record.extra = self._prepare(record, count=False)  # rows may have moved
            # With a cache, the new look-up may have written hits into the fallback: keep it.
            record.swap = record.swap and not self.parent_binds
            self._send(record)
        log.warning("%s; replaced by pid %d, re-running %d batch(es)%s", death.where, new_pid,
                    len(current) - len(given_up), f", giving up {len(given_up)}" if given_up else "")
        return given_up

    def _give_up(self, record: TaskRecord, death: WorkerDeath) -> Failed:
        """Answer a task whose workers kept dying: it will not be re-sent (its slot is freed by
        ``failure``, as written)."""
        self._ledger.answered(record.key, record.worker_id)
        self._records.pop(record.key, None)
        self._stats.errors += 1
        error = WorkerError(
            f"{death.where} while running task {record.idx} (indices {record.index!r}); {record.deaths} "
            f"worker(s) died running it, more than max_task_retries={self.max_task_retries}, so it is not "
            "re-run (an input that crashes the worker, or memory)."
        )
        return Failed(epoch=record.epoch, idx=record.idx, error=WorkerException.capture(error))

    def close(self) -> None:
        """Stop the workers and release their slots now (idempotent)."""
        self._finalizer()
        self._records.clear()
        self._completed.clear()


def _num_samples(index: Any) -> int:
    """Samples in a task: the batch's length, 1 without auto-collation."""
    try:
        return len(index)
    except TypeError:
        return 1
