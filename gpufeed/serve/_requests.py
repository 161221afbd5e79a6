"""The image batcher's side of the engine: requests' encoded bytes into a slot, decoded there.

A batch of n requests is one engine task (``gpufeed._engine.engine``). The parent writes the
requests' encoded bytes into the staging area of the task's slot (``RequestFeed.prepare``, the
plug-in hook the image path's encoded cache uses for its hits), so only (position, offset,
nbytes) triples cross the task pipe; the worker's ``ImageFiller`` decodes each one into the
slot's rows, as it decodes cache hits. Why the slot and not the pipe: the bytes are copied once
into shared memory either way, but through a pipe they are also pickled, written, read and
unpickled, and a large payload blocks the parent on a full pipe (docs/design/engine-lifecycle.md:
only small messages cross the pipes). Re-sending a task after a worker death runs ``prepare`` again from
the task's tag (the payloads), so a re-run decodes the same bytes.

``EngineDriver`` lets several model threads share one engine: each submits its task and waits
for its reply; whoever waits polls the engine (in short turns, under one lock) and files the
replies it reads for their owners. Nobody polls while no task is in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from gpufeed._engine.engine import Engine, TaskKey, TaskRecord
from gpufeed._engine.layout import align_up
from gpufeed._engine.messages import Done, End, Failed
from gpufeed._engine.plugin import FillPlugin
from gpufeed.errors import WorkerError
from gpufeed.image._fill import ImageFiller, ImagePlan, ImageTask

POLL_S = 0.002  # one turn of polling the engine while another thread may want to submit (s)
IDLE_WAIT_S = 0.05  # a thread not holding the turn re-checks at least this often (s)


class RequestSource:
    """The image batcher's "dataset" in the workers: a sample index is a request's number.

    The worker never reads from it (the bytes arrive in the slot); it labels each row with the
    request number and names a request in decode errors.
    """

    def target(self, index: int) -> int:
        """The request number itself: the batch's labels say which request each row is."""
        return int(index)

    def describe(self, index: int) -> str:
        """``request #N``, for messages."""
        return f"request #{index}"

    def read_item(self, index: int) -> tuple[Any, int]:
        """Never called: every request's bytes are in the slot."""
        raise RuntimeError(f"gpufeed.serve: request #{index} has no bytes in its slot (internal error)")


class RequestFeed(FillPlugin):
    """The engine plug-in (``FillPlugin``) of the image batcher: bytes in at submission."""

    def __init__(self, plan: ImagePlan) -> None:
        self.plan = plan
        self.filler = ImageFiller(plan)

    @property
    def parent_binds(self) -> bool:
        """``prepare`` writes the bytes into the slot, so the slot is bound at submission."""
        return True

    def staging_bytes(self, sizes: Sequence[int]) -> int:
        """Slot bytes a batch of requests of these encoded sizes needs (rows, labels, floats, bytes)."""
        return self.plan.layout(len(sizes)).staging + sum(align_up(s) for s in sizes)

    def prepare(self, payloads: Sequence[Any], indices: list[int], slot: torch.Tensor, count: bool = True,
                found: Any = None) -> ImageTask:
        """Copy each request's encoded bytes into the slot's staging area; the task says where
        (``found``: always None, this plug-in's look-up finds nothing)."""
        cursor = start = self.plan.layout(len(indices)).staging
        given = []
        for pos, data in enumerate(payloads):
            view = memoryview(data).cast("B")
            slot[cursor : cursor + view.nbytes].numpy()[:] = view
            given.append((pos, cursor, view.nbytes))
            cursor = align_up(cursor + view.nbytes)
        return ImageTask(0, given=tuple(given), staging_used=cursor - start)

    def absorb(self, indices: Any, extra: Any, report: Any, slot: torch.Tensor) -> None:
        """Nothing to keep (no cache)."""


class _Waiter:
    """One task's place in the driver: its record once submitted, its reply once read."""

    __slots__ = ("abandoned", "event", "indices", "payloads", "record", "reply")

    def __init__(self, indices: list[int], payloads: Sequence[Any]) -> None:
        self.indices, self.payloads = indices, payloads
        self.record: TaskRecord | None = None
        self.reply: Done | Failed | End | None = None
        self.event = threading.Event()
        self.abandoned = False  # its thread stopped waiting: a reply is dropped, not filed


class EngineDriver:
    """One engine shared by the batcher's model threads: ``run`` a task, get its reply.

    The engine is used by one thread at a time: whoever holds ``_turn`` submits the tasks waiting
    to be submitted, polls for ``POLL_S`` and files the replies, waking their owners; the others
    sleep on their own event. A thread that leaves (its reply came, or it gave up) wakes one
    other waiter, which takes the turn; nobody waits more than ``IDLE_WAIT_S`` without looking.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._turn = threading.Lock()  # held while the engine is used
        self._mutex = threading.Lock()  # guards the fields below, never held while polling
        self._unsent: list[_Waiter] = []
        self._waiting: dict[TaskKey, _Waiter] = {}
        self._error: BaseException | None = None  # the engine failed for good (WorkerError)

    def run(self, indices: list[int], payloads: Sequence[Any], timeout_s: float,
            ) -> tuple[TaskRecord, Done | Failed | End]:
        """Submit one task (``payloads`` travel as its tag to ``RequestFeed.prepare``) and wait for
        its reply, at most ``timeout_s`` seconds; worker deaths are handled while waiting."""
        waiter = _Waiter(indices, payloads)
        with self._mutex:
            self._unsent.append(waiter)
        deadline = time.monotonic() + timeout_s
        while True:
            waiter.event.clear()  # (a set after this is seen by the wait below)
            with self._mutex:
                if waiter.reply is not None:
                    assert waiter.record is not None
                    self._pass_turn(waiter)
                    return waiter.record, waiter.reply
                if self._error is not None:
                    raise WorkerError(f"gpufeed.serve: the decode workers are gone: {self._error}") from self._error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._pass_turn(waiter)
                    raise self._abandon(waiter, timeout_s)
            if self._turn.acquire(blocking=False):
                try:
                    self._take_turn()
                finally:
                    self._turn.release()
            else:  # the holder files our reply (and submits our task), or passes us the turn
                waiter.event.wait(min(IDLE_WAIT_S, remaining))

    def _pass_turn(self, leaving: _Waiter) -> None:
        """(mutex held) ``leaving`` stops polling: wake one other waiter to take the turn."""
        for other in (*self._unsent, *self._waiting.values()):
            if other is not leaving and not other.abandoned:
                other.event.set()
                return

    def close(self, timeout_s: float) -> None:
        """Stop the engine once no thread is using it (waits up to ``timeout_s`` for the turn);
        a thread still waiting for a reply then fails with ``WorkerError``."""
        got = self._turn.acquire(timeout=max(timeout_s, POLL_S * 10))
        try:
            with self._mutex:
                if self._error is None:
                    self._error = RuntimeError("the batcher was closed")
                for waiter in [*self._waiting.values(), *self._unsent]:
                    waiter.event.set()
            self.engine.close()
        finally:
            if got:
                self._turn.release()

    def _take_turn(self) -> None:
        with self._mutex:
            if self._error is not None:
                return  # closed, or failed for good: run() raises it
            unsent, self._unsent = self._unsent, []
        try:
            for waiter in unsent:
                with self._mutex:
                    if waiter.abandoned:
                        continue
                record = self.engine.submit(waiter.indices, tag=waiter.payloads)
                with self._mutex:
                    waiter.record = record
                    self._waiting[record.key] = waiter
            arrivals = self.engine.poll(POLL_S)
        except BaseException as exc:  # the engine is closed (restarts exhausted): everyone fails
            with self._mutex:
                self._error = exc
                for waiter in [*self._waiting.values(), *unsent, *self._unsent]:
                    waiter.event.set()
            raise
        with self._mutex:
            for record, reply in arrivals:
                owner = self._waiting.pop(record.key, None)
                if owner is None or owner.abandoned:  # its thread gave up waiting: nobody reads it
                    self.engine.drop(record)
                    continue
                owner.reply = reply
                owner.event.set()

    def _abandon(self, waiter: _Waiter, timeout_s: float) -> TimeoutError:
        """(mutex held) Forget ``waiter``: a reply that still comes is dropped."""
        waiter.abandoned = True
        if waiter in self._unsent:
            self._unsent.remove(waiter)
        where = "was never submitted (another thread held the engine)"
        if waiter.record is not None:
            rec = waiter.record
            where = f"(task {rec.idx} on worker {rec.worker_id}, pid {self.engine.pid(rec.worker_id)}) got no reply"
        return TimeoutError(
            f"gpufeed.serve: a batch's decode {where} within decode_timeout_s={timeout_s} s; "
            "raise decode_timeout_s if images are huge or the machine is overloaded."
        )
