"""Every message between the parent and a worker, one NamedTuple each.

They are pickled over each worker's own pipes (``multiprocessing.connection``); batch payloads
never travel here, they stay in the arena. Both sides build messages and read them by field
name, and dispatch on the type (``isinstance`` or ``match``). NamedTuples pickle as a class
reference plus a tuple: a few microseconds per message, nothing next to a batch.

A task is named by ``(epoch, idx)``: ``epoch`` counts the engine's passes (``Reset``), ``idx``
the tasks submitted in that pass, from 0.

parent -> worker: ``Task``, ``Reset``, ``Restore``, ``Exit``
worker -> parent: ``Claim`` (zero or one per task, before ``Done``), then one of ``Done``,
``Failed``, ``End`` per task; ``InitFailed`` once, instead of any task reply, when the worker
could not start.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Any, NamedTuple


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
            except Exception:  # noqa: BLE001 (unpicklable exception: rebuilt from its type and message)
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
            except Exception:  # noqa: BLE001, S112 (the next way, then a RuntimeError)
                continue
            if isinstance(exc, BaseException):
                return exc
        return RuntimeError(f"{self.type_name}: {self.message}")

    def _from_instance(self) -> object:
        return None if self.pickled is None else pickle.loads(self.pickled)

    def _from_type(self) -> object:
        """The type, without running its ``__init__`` (which may want other arguments)."""
        if self.pickled_type is None:
            return None
        exc_type = pickle.loads(self.pickled_type)
        exc = exc_type.__new__(exc_type, self.message)
        exc.args = (self.message,)
        return exc


# -- parent -> worker ---------------------------------------------------------------------------


class Task(NamedTuple):
    """Run ``index`` and pack the result into ``slot``.

    ``index``: what the worker's fetch takes (a list of sample indices, one index, or None for
    an IterableDataset), or what the filler takes. ``extra``: the plug-in's per-task data (an
    ``ImageTask`` on the image path), else None. ``swap``: the worker may write a warm slot
    from the arena's pipe instead (it then sends a ``Claim`` before writing); without it the
    parent already wrote into ``slot``.
    """

    epoch: int
    idx: int
    slot: int
    index: Any
    extra: Any
    swap: bool


class Reset(NamedTuple):
    """A new pass (persistent workers): a fresh iterator over an IterableDataset, tasks of
    ``epoch`` from now on."""

    epoch: int


class Restore(NamedTuple):
    """Before the first task of a resumed pass (docs/design/resume.md): set the worker's random
    states to ``rng`` (a ``gpufeed._resume.rng.RngState``; None: leave them), and with
    ``dataset_state`` not None, ``load_state_dict`` it into the worker's IterableDataset copy,
    whose next iterator starts there."""

    rng: Any
    dataset_state: Any


class Exit(NamedTuple):
    """Finish: return from the task loop (the tasks still queued are skipped)."""


# -- worker -> parent ---------------------------------------------------------------------------


class Claim(NamedTuple):
    """Task ``(epoch, idx)`` is written into warm ``slot``, not its fallback. Sent before the
    first byte is written, so a worker that dies later strands nothing."""

    epoch: int
    idx: int
    slot: int


class Done(NamedTuple):
    """Task ``(epoch, idx)`` is in its slot: ``skeleton`` (see ``transport.pack``) rebuilds it
    from the first ``used_bytes`` of the slot; ``overflow_bytes`` went inline in the skeleton.
    Seconds per stage; ``report``: the filler's report (a ``FillReport``), None without one.
    With state tracking (``WorkerSpec.track_state``): ``rng``, the worker's random states after
    the task when they changed since its last send (else None), and ``dataset_state``, its
    IterableDataset copy's ``state_dict()`` after the task (else None)."""

    epoch: int
    idx: int
    skeleton: bytes
    used_bytes: int
    overflow_bytes: int
    fetch_s: float
    collate_s: float
    pack_s: float
    report: Any
    rng: Any = None
    dataset_state: Any = None


class Failed(NamedTuple):
    """Task ``(epoch, idx)`` raised in dataset, collate or filler code."""

    epoch: int
    idx: int
    error: WorkerException


class End(NamedTuple):
    """The worker's IterableDataset is exhausted at task ``(epoch, idx)``; like torch, the
    worker answers no later task of this epoch."""

    epoch: int
    idx: int


class InitFailed(NamedTuple):
    """``worker_init_fn`` (or the fetcher's set-up) raised; the worker exits."""

    error: WorkerException


ToWorker = Task | Reset | Restore | Exit
FromWorker = Claim | Done | Failed | End | InitFailed
Reply = Done | Failed | End  # the one answer each task gets
