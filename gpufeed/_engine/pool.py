"""Worker processes: start, watch, replace, tear down.

Each worker has two one-way pipes of its own (tasks in, results out), so a worker killed in the
middle of a write corrupts nothing shared: the parent sees EOF on that worker's pipe and its
sentinel, and nobody else is blocked on a lock the dead process held. The parent waits on all
result pipes *and* all process sentinels at once, so a death is noticed as soon as it happens.

Workers start in the constructor, or with ``lazy=True`` one at a time, the first time a task is
sent to them (``ensure``): same id, same seed, only later (docs/design/engine-lifecycle.md, "Lazy
workers").

Teardown order (``shutdown``): send ``Exit``, join within ``shutdown_timeout_s``,
SIGTERM, join 1 s, SIGKILL, join; then close the parent's pipe ends. The caller releases the
arena slots of unfinished tasks only after this returns (no writer is left).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import multiprocessing.connection as mpc
import os
import select
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from gpufeed._engine.messages import Exit, FromWorker, ToWorker
from gpufeed._engine.signals import sigint_held
from gpufeed._engine.worker import WorkerSpec, worker_main

log = logging.getLogger(__name__)

_PIPE_BYTES = 1 << 20  # larger pipe buffers: a result never blocks a worker on a busy parent
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _grow_pipe(conn: mpc.Connection) -> None:
    try:
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # capped by /proc/sys/fs/pipe-max-size: the default buffer still works


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGKILL' / 'exited with code 3' / 'still running'."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


@dataclass
class _Worker:
    process: BaseProcess
    tasks: mpc.Connection  # parent writes
    results: mpc.Connection  # parent reads


def _pid(w: _Worker) -> int:
    pid = w.process.pid
    assert pid is not None, "a started process has a pid"
    return pid


class WorkerPool:
    """The worker processes of one engine, indexed by worker id.

    ``fork_guard`` is entered around each ``Process.start()`` under the fork start method.
    ``lazy``: start no worker now; ``ensure(worker_id)`` starts one when it is first needed.
    """

    def __init__(
        self,
        ctx: BaseContext,
        spec: WorkerSpec,
        num_workers: int,
        shutdown_timeout_s: float,
        fork_guard: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        lazy: bool = False,
    ) -> None:
        self._ctx = ctx
        self._stopping = ctx.RawValue("b", 0)  # tells workers to skip their queued tasks
        self._spec = replace(spec, stopping=self._stopping)
        self._fork = ctx.get_start_method() == "fork"
        self._fork_guard = fork_guard
        self._shutdown_timeout_s = shutdown_timeout_s
        self._owner_pid = os.getpid()
        self._workers: list[_Worker | None] = [None] * num_workers
        self.closed = False
        self.started = 0  # processes started so far, replacements included
        # What ``wait`` polls, built once per change of the workers (a poll set made on every
        # call, as multiprocessing.connection.wait does, costs O(workers) per batch).
        self._watch: tuple[Any, dict[int, tuple[int, str]]] | None = None
        if lazy:
            return
        try:
            for worker_id in range(num_workers):
                self._start(worker_id)
        except BaseException:  # e.g. an unpicklable dataset under spawn: stop those started
            self.shutdown()
            raise

    @property
    def owned_here(self) -> bool:
        """False in a forked child that inherited this object: it must not act on it."""
        return os.getpid() == self._owner_pid

    @property
    def pids(self) -> list[int]:
        return [_pid(w) for w in self._workers if w is not None]

    def pid(self, worker_id: int) -> int:
        w = self._workers[worker_id]
        return -1 if w is None else _pid(w)

    def is_started(self, worker_id: int) -> bool:
        return self._workers[worker_id] is not None

    def ensure(self, worker_id: int) -> None:
        """Start ``worker_id`` if it is not running yet (a lazy pool's first task for it)."""
        if self._workers[worker_id] is None:
            if self.closed:
                raise RuntimeError("gpufeed: the workers were shut down (close(), or the loader was closed)")
            self._start(worker_id)

    def _parent_fds(self) -> tuple[int, ...]:
        return tuple(
            fd for w in self._workers if w is not None for fd in (w.tasks.fileno(), w.results.fileno())
        )

    def _start(self, worker_id: int) -> None:
        task_r, task_w = self._ctx.Pipe(duplex=False)
        res_r, res_w = self._ctx.Pipe(duplex=False)
        for c in (task_w, res_w):
            _grow_pipe(c)
        inherited = self._parent_fds() + (task_w.fileno(), res_r.fileno()) if self._fork else ()
        parent_pid = 0 if self._ctx.get_start_method() == "forkserver" else self._spec.parent_pid
        spec = replace(self._spec, worker_id=worker_id, inherited_fds=inherited, parent_pid=parent_pid)
        proc: BaseProcess = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main, args=(spec, task_r, res_w), name=f"gpufeed-worker-{worker_id}", daemon=True
        )
        try:
            with self._fork_guard() if self._fork else contextlib.nullcontext(), sigint_held():
                proc.start()
        except BaseException:
            task_w.close()
            res_r.close()
            raise
        finally:
            task_r.close()
            res_w.close()
        self._workers[worker_id] = _Worker(proc, task_w, res_r)
        self._watch = None
        self.started += 1

    def send(self, worker_id: int, msg: ToWorker) -> None:
        w = self._workers[worker_id]
        assert w is not None
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the worker is dead; its sentinel reports it and the task is re-sent

    def wait(self, timeout_s: float) -> tuple[list[tuple[int, FromWorker]], list[int]]:
        """Block up to ``timeout_s`` for results or deaths.

        Returns (messages as (worker id, message) in arrival order per worker, dead worker ids).
        A dead worker's complete messages are drained before it is reported dead.
        """
        if timeout_s <= 0 and all(w is None for w in self._workers):
            return [], []  # a lazy pool with no worker yet: nothing to wait on (a full-hit epoch)
        ready = self._ready(timeout_s)
        messages: list[tuple[int, FromWorker]] = []
        dead: list[int] = []
        for worker_id, kind in ready:
            w = self._workers[worker_id]
            assert w is not None
            if kind == "r":
                if not self._drain(worker_id, w.results, messages) and worker_id not in dead:
                    dead.append(worker_id)
            elif worker_id not in dead:
                self._drain(worker_id, w.results, messages)
                dead.append(worker_id)
        for worker_id in dead:  # a closed pipe alone may precede the exit by a moment
            w = self._workers[worker_id]
            assert w is not None
            w.process.join(timeout=1.0)
        return messages, dead

    def _ready(self, timeout_s: float) -> list[tuple[int, str]]:
        """(worker id, "r" for its result pipe or "s" for its sentinel) of what is readable
        (data, EOF or exit) within ``timeout_s``, as ``multiprocessing.connection.wait`` tells."""
        if not hasattr(select, "poll"):  # no poll(2): the selector made per call
            by_obj: dict[Any, tuple[int, str]] = {}
            for i, w in enumerate(self._workers):
                if w is not None:
                    by_obj[w.results] = (i, "r")
                    by_obj[w.process.sentinel] = (i, "s")
            return [by_obj[obj] for obj in mpc.wait(list(by_obj), timeout_s)]
        if self._watch is None:
            poller = select.poll()
            by_fd: dict[int, tuple[int, str]] = {}
            for i, w in enumerate(self._workers):
                if w is not None:
                    for fd, kind in ((w.results.fileno(), "r"), (w.process.sentinel, "s")):
                        poller.register(fd, select.POLLIN)
                        by_fd[fd] = (i, kind)
            self._watch = (poller, by_fd)
        poller, by_fd = self._watch
        # Any event counts, as for the selector: POLLHUP (EOF) and POLLERR are read as ready.
        events = poller.poll(max(0, math.ceil(timeout_s * 1e3)))
        return [by_fd[fd] for fd, _ in events if fd in by_fd]

    @staticmethod
    def _drain(worker_id: int, conn: mpc.Connection, out: list[tuple[int, FromWorker]]) -> bool:
        """Read every complete message waiting on ``conn``; False once the pipe is closed."""
        try:
            while conn.poll(0):
                out.append((worker_id, conn.recv()))
        except (EOFError, OSError):
            return False
        return True

    def exitcode(self, worker_id: int) -> int | None:
        w = self._workers[worker_id]
        return None if w is None else w.process.exitcode

    def replace(self, worker_id: int) -> int:
        """Start a fresh process for ``worker_id`` (same id, same seed); returns its pid."""
        old = self._workers[worker_id]
        if old is not None:
            self._stop([old])
        self._workers[worker_id] = None
        self._watch = None
        self._start(worker_id)
        return self.pid(worker_id)

    def shutdown(self) -> list[tuple[int, FromWorker]]:
        """Stop every worker (idempotent; a no-op in processes other than the owner).

        Workers skip the tasks still queued (a shared flag, as torch's ``done_event``) but finish
        the one they are running. Returns the messages they sent and nobody read, as (worker
        id, message): these can be claims of arena slots that the caller must free.
        """
        if self.closed or os.getpid() != self._owner_pid:
            return []
        self.closed = True
        self._stopping.value = 1
        ids = [i for i, w in enumerate(self._workers) if w is not None]
        workers = [w for w in self._workers if w is not None]
        self._workers = [None] * len(self._workers)
        self._watch = None
        return self._stop(workers, ids)

    def _stop(self, workers: list[_Worker], ids: list[int] | None = None) -> list[tuple[int, FromWorker]]:
        for w in workers:
            try:
                w.tasks.send(Exit())
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
        deadline = time.monotonic() + self._shutdown_timeout_s
        for w in workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for sig_step in ("terminate", "kill"):
            alive = [w for w in workers if w.process.is_alive()]
            if not alive:
                break
            log.debug("gpufeed: %s %d worker(s) that did not exit in time", sig_step, len(alive))
            for w in alive:
                getattr(w.process, sig_step)()
            for w in alive:
                w.process.join(timeout=1.0)
        unread: list[tuple[int, FromWorker]] = []
        for worker_id, w in zip(ids if ids is not None else range(len(workers)), workers):
            self._drain(worker_id, w.results, unread)  # the writer is gone: no partial message waits
            for c in (w.tasks, w.results):
                try:
                    c.close()
                except OSError:
                    pass
            try:
                w.process.close()
            except ValueError:
                pass  # still running after SIGKILL (uninterruptible sleep): the OS reaps it later
        return unread
