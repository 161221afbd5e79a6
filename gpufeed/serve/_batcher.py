"""DynamicBatcher: requests from any thread or event loop, one model call per batch.

Lifecycle (one scheduler thread ``gpufeed-batcher``, ``max_concurrent_batches`` model threads
``gpufeed-batcher-model-N``; all state in ``_Core`` so that the threads hold no reference to the
``DynamicBatcher`` and ``weakref.finalize`` can close a forgotten one):

1. ``submit`` runs ``validate`` (if any) in the caller's thread, then appends the request under
   the core's condition, or raises ``Overloaded`` (queue full, or with ``max_latency_ms`` its
   predicted latency over budget: ``_admission.RunTimes``) / ``BatcherClosedError``.
2. The scheduler, holding the condition, drops cancelled requests, fails expired ones with
   ``TimeoutError``, and dispatches a batch when a model slot is free and the batch is full or
   its oldest request has waited ``max_delay_ms`` (counted from that request's arrival).
   Otherwise it waits on the condition until the oldest request's timer or the nearest
   deadline, at most ``MAX_WAIT_S``; a submit that changes what it waits for (the first
   request, a full batch, an earlier deadline), cancel, a freed slot and close wake it.
3. A model thread pads, calls ``fn``, and settles the futures outside any lock. Then, under the
   condition, it applies the same rule itself: if the next batch may go now it takes it and
   runs it (the busy path needs no scheduler wake-up and no hand-off), else it frees its slot
   and wakes the scheduler.
4. ``close(drain=True)`` stops intake, dispatches what is queued without waiting for the timer,
   joins the threads within ``timeout_s``, and cancels what is still queued after that.
   ``close(drain=False)`` cancels every queued request at once and waits for running batches.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpufeed.errors import add_note, shorten
from gpufeed.serve._admission import RunTimes
from gpufeed.serve._clock import MAX_WAIT_S, Clock, MonotonicClock
from gpufeed.serve._config import BatcherConfig
from gpufeed.serve._errors import BatcherClosedError, Overloaded
from gpufeed.serve._stats import BatcherStats

__all__ = ["DynamicBatcher"]

log = logging.getLogger(__name__)

SCHEDULER_THREAD_NAME = "gpufeed-batcher"
MODEL_THREAD_NAME = "gpufeed-batcher-model-{}"


@dataclass
class _Request:
    item: Any
    future: Future
    arrival: float
    deadline: float  # math.inf: none
    timeout_s: float | None


def _timeout_error(request: _Request, now: float, name: str) -> TimeoutError:
    return TimeoutError(
        f"request waited {now - request.arrival:.3f} s in DynamicBatcher {name!r}'s queue, past its "
        f"deadline of timeout_s={request.timeout_s} s (set by submit(x, timeout_s=...) or "
        "default_timeout_s); it never reached the model."
    )


class _Core:
    """Everything the threads share. ``cond`` guards the queue, slots and the closing state."""

    def __init__(
        self,
        fn: Callable[[Any], Sequence[Any]],
        config: BatcherConfig,
        clock: Clock,
        collate: Callable[[list[Any]], Any] | None,
    ) -> None:
        self.fn = fn
        self.config = config
        self.clock = clock
        self.collate = collate
        self.cond = threading.Condition()
        self.queue: collections.deque[_Request] = collections.deque()
        self.free_slots = config.max_concurrent_batches
        self.next_expiry = math.inf
        self.dirty = False  # a queued future was cancelled
        self.closing = False
        self.drain = True
        self.batch_seq = 0
        self.work: queue.SimpleQueue[tuple[int, list[_Request]] | None] = queue.SimpleQueue()
        self.stats = BatcherStats(config.max_batch_size)
        self.threads: list[threading.Thread] = []
        self.delay_s = config.max_delay_ms / 1000.0
        self.run_times = RunTimes()  # batch run times, for max_latency_ms (under cond)

    # -- scheduler ------------------------------------------------------------------------------

    def on_done(self, future: Future) -> None:
        if future.cancelled():
            with self.cond:
                self.dirty = True
                self.cond.notify()

    def drop_cancelled(self) -> None:
        """Remove cancelled requests from the queue now (the scheduler may not have woken yet)."""
        if self.dirty:
            live = collections.deque(r for r in self.queue if not r.future.cancelled())
            self.stats.add("cancelled", len(self.queue) - len(live))
            self.queue = live
            self.dirty = False

    def _purge(self, now: float, expired: list[_Request]) -> None:
        """Drop cancelled requests and move expired ones (marked running) to ``expired``."""
        if not self.dirty and now < self.next_expiry:
            return
        kept: collections.deque[_Request] = collections.deque()
        next_expiry = math.inf
        for r in self.queue:
            if r.future.cancelled():
                self.stats.add("cancelled")
            elif r.deadline <= now:
                if r.future.set_running_or_notify_cancel():
                    expired.append(r)
                else:
                    self.stats.add("cancelled")
            else:
                kept.append(r)
                next_expiry = min(next_expiry, r.deadline)
        self.queue = kept
        self.next_expiry = next_expiry
        self.dirty = False

    def _take(self, now: float, expired: list[_Request]) -> list[_Request]:
        """Pop up to ``max_batch_size`` live requests, oldest first, each marked running."""
        batch: list[_Request] = []
        while self.queue and len(batch) < self.config.max_batch_size:
            r = self.queue.popleft()
            if r.deadline <= now:
                if r.future.set_running_or_notify_cancel():
                    expired.append(r)
                else:
                    self.stats.add("cancelled")
            elif r.future.set_running_or_notify_cancel():
                batch.append(r)
            else:
                self.stats.add("cancelled")
        return batch

    def _ready(self, now: float, expired: list[_Request]) -> list[_Request]:
        """(cond held, queue purged) The next batch if the rule lets it go now, else ``[]``.

        A batch goes when a slot is free and it is full, or its oldest request has waited
        ``max_delay_ms``, or the batcher is closing (drain). Taking it claims the slot."""
        while self.queue and self.free_slots > 0:
            if not (
                len(self.queue) >= self.config.max_batch_size
                or now - self.queue[0].arrival >= self.delay_s
                or self.closing
            ):
                return []
            batch = self._take(now, expired)
            if batch:
                self.free_slots -= 1
                self.batch_seq += 1
                self.run_times.started(self.batch_seq, now, self.config.padded_size(len(batch)))
                return batch
        return []

    def check_latency(self, now: float) -> None:
        """(cond held) Raise ``Overloaded`` if a request appended now would be answered later
        than ``max_latency_ms`` from now, as far as the measured batch run times tell."""
        self.drop_cancelled()
        queued, size = len(self.queue), self.config.max_batch_size
        first_of_last = (queued // size) * size  # the batch the new request would join starts here
        oldest = self.queue[first_of_last].arrival if first_of_last < queued else now
        answer_s = self.run_times.answer_in_s(now, queued, oldest, self.free_slots, size, self.delay_s,
                                              self.config.padded_size)
        budget_ms = self.config.max_latency_ms
        if answer_s is None or budget_ms is None or answer_s * 1000.0 <= budget_ms:
            return
        self.stats.add("rejected")
        self.stats.add("rejected_latency")
        batch_ms = (self.run_times.estimate_s(size) or 0.0) * 1000.0
        running = self.config.max_concurrent_batches - self.free_slots
        raise Overloaded(
            f"DynamicBatcher {self.config.name!r} is overloaded: a request now would be answered in about "
            f"{answer_s * 1000.0:.0f} ms ({queued} requests queued, {running} "
            f"batches running, a batch of {size} takes about {batch_ms:.0f} ms), over max_latency_ms={budget_ms:g}. "
            "Retry later (HTTP 503), or raise `max_latency_ms` or `max_concurrent_batches` if the model keeps up."
        )

    def _fail_expired(self, expired: list[_Request], now: float) -> None:
        if expired:
            self.stats.add("expired", len(expired))
            for r in expired:
                r.future.set_exception(_timeout_error(r, now, self.config.name))

    def _observe_dispatch(self, batch: list[_Request], now: float) -> None:
        with self.stats.lock:
            self.stats.batch_size.observe(len(batch))
            for r in batch:
                self.stats.queue_wait_s.observe(max(0.0, now - r.arrival))

    def schedule(self) -> None:
        while True:
            expired: list[_Request] = []
            cancel: list[_Request] = []
            batch: list[_Request] = []
            stop = False
            with self.cond:
                while True:
                    now = self.clock.now()
                    self._purge(now, expired)
                    if self.closing and not self.drain:
                        cancel = list(self.queue)
                        self.queue.clear()
                        stop = True
                        break
                    batch = self._ready(now, expired)
                    if batch:
                        break
                    if self.closing and not self.queue:
                        stop = True
                        break
                    if expired:
                        break
                    timeout: float | None = None
                    if self.queue and self.free_slots > 0:
                        timeout = self.queue[0].arrival + self.delay_s - now
                    if self.next_expiry < math.inf:
                        timeout = min(self.next_expiry - now, math.inf if timeout is None else timeout)
                    self.clock.wait(self.cond, timeout)
                seq = self.batch_seq
            self._fail_expired(expired, now)
            for r in cancel:
                if r.future.cancel():
                    self.stats.add("cancelled")
            if batch:
                self._observe_dispatch(batch, now)
                self.work.put((seq, batch))
            if stop:
                for _ in range(self.config.max_concurrent_batches):
                    self.work.put(None)
                return

    # -- model threads --------------------------------------------------------------------------

    def serve_batches(self) -> None:
        job: tuple[int, list[_Request]] | None = None
        while True:
            if job is None:
                try:
                    job = self.work.get(timeout=MAX_WAIT_S)
                except queue.Empty:
                    continue
                if job is None:
                    return
            seq, batch = job
            try:
                self._run(seq, batch)
            except BaseException:
                with self.cond:
                    self.run_times.ended(seq, self.clock.now())
                    self.free_slots += 1
                    self.cond.notify()
                raise
            job = self._next_job(seq)

    def _next_job(self, ended: int) -> tuple[int, list[_Request]] | None:
        """Batch ``ended`` has ended in this model thread: take the next batch here if the rule
        lets it go now (no hand-off through the scheduler, which costs two thread wake-ups and
        GIL hand-offs per batch), else free the slot and wake the scheduler."""
        expired: list[_Request] = []
        batch: list[_Request] = []
        with self.cond:
            now = self.clock.now()
            self.run_times.ended(ended, now)
            self.free_slots += 1
            if not self.closing:
                self._purge(now, expired)
                batch = self._ready(now, expired)
            if not batch:
                self.cond.notify()
            seq = self.batch_seq
        self._fail_expired(expired, now)
        if not batch:
            return None
        self._observe_dispatch(batch, now)
        return seq, batch

    def _run(self, seq: int, batch: list[_Request]) -> None:
        n = len(batch)
        size = self.config.padded_size(n)
        items = [r.item for r in batch]
        items += [items[-1]] * (size - n)
        where = (
            f"gpufeed.serve: in batch #{seq} of DynamicBatcher {self.config.name!r} "
            f"({n} requests" + (f", padded to {size})" if size > n else ")")
        )
        self.stats.add("batches")
        try:
            inputs = self.collate(items) if self.collate is not None else items
            results = self.fn(inputs)
            if len(results) != size:
                raise ValueError(
                    f"the model function returned {len(results)} results for a batch of {size} inputs; "
                    "it must return one result per input (a list, or a tensor with batch dimension first)."
                )
        except Exception as exc:
            add_note(exc, where)
            self.stats.add("failed", n)
            for r in batch:
                r.future.set_exception(exc)
            self._observe_latency(batch)
            return
        failed = 0
        for i, r in enumerate(batch):
            result = results[i]
            if isinstance(result, BaseException):
                failed += 1
                r.future.set_exception(add_note(result, where + f", item {i}"))
            else:
                r.future.set_result(result)
        with self.stats.lock:
            self.stats.counters["completed"] += n - failed
            self.stats.counters["failed"] += failed
        self._observe_latency(batch)

    def _observe_latency(self, batch: list[_Request]) -> None:
        now = self.clock.now()
        with self.stats.lock:
            for r in batch:
                self.stats.latency_s.observe(max(0.0, now - r.arrival))

    # -- shutdown -------------------------------------------------------------------------------

    def shutdown(self, drain: bool, timeout_s: float) -> None:
        with self.cond:
            self.closing = True
            self.drain = self.drain and drain
            self.cond.notify_all()
        others = [t for t in self.threads if t is not threading.current_thread()]
        deadline = time.monotonic() + timeout_s
        for thread in others:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in others):
            with self.cond:  # out of time: cancel what is still queued, then wait briefly
                self.drain = False
                self.cond.notify_all()
            for thread in others:
                thread.join(min(MAX_WAIT_S, timeout_s))
        stuck = [t.name for t in others if t.is_alive()]
        if stuck:
            log.warning(
                "DynamicBatcher %r: threads %s still running after close(timeout_s=%s) "
                "(the model function has not returned); they are daemons and end with it",
                self.config.name,
                stuck,
                timeout_s,
            )


def _default_collate(items: list[Any]) -> Any:
    from torch.utils.data import default_collate  # torch only when collate=True is used

    return default_collate(items)


class DynamicBatcher:
    """Collects single requests into batches for one model function.

    A batch is dispatched as soon as a model slot is free and either it is full
    (``max_batch_size``) or its **oldest** request has waited ``max_delay_ms``, counted from that
    request's arrival (``max_delay_ms=0``: whatever is queued goes at once). Requests past their
    deadline fail with ``TimeoutError`` and cancelled ones are dropped, both before their batch
    runs, so neither takes a batch slot. A full queue rejects with :class:`Overloaded` at once,
    and so does, with ``max_latency_ms``, a request predicted to be answered later than that.

    Failures: an exception from ``fn`` (or from ``collate``) fails every request of that batch
    with that exception (type kept, a note naming the batch); the batcher keeps serving. To fail
    single requests: ``validate(x)`` runs in ``submit``'s thread and an exception from it fails
    only that request's future; and ``fn`` may return an exception instance in place of an
    item's result, which fails only that item.

    Args:
        fn: called with a list of inputs (or, with ``collate``, the collated batch); returns one
            result per input, in order (a list, or anything with ``len`` and indexing, such as a
            tensor with batch dimension first).
        max_batch_size: see :class:`BatcherConfig` (as are the options not listed here).
        max_delay_ms: see :class:`BatcherConfig`.
        max_queue: see :class:`BatcherConfig`.
        max_latency_ms: see :class:`BatcherConfig` (latency-aware admission).
        collate: False (``fn`` gets a list), True (torch's ``default_collate``), or a callable
            applied to the list of inputs.
        validate: called on each input in ``submit``; an exception fails that request only.
        clock: time source; tests inject a :class:`~gpufeed.serve.ManualClock`.

    Attributes:
        config: the :class:`BatcherConfig`; each of its fields is also an attribute here.
    """

    def __init__(
        self,
        fn: Callable[[Any], Sequence[Any]],
        *,
        max_batch_size: int,
        max_delay_ms: float,
        max_queue: int,
        max_concurrent_batches: int = 1,
        max_latency_ms: float | None = None,
        preferred_batch_sizes: Sequence[int] = (),
        collate: bool | Callable[[list[Any]], Any] = False,
        validate: Callable[[Any], object] | None = None,
        default_timeout_s: float | None = None,
        close_timeout_s: float = 30.0,
        name: str = "batcher",
        clock: Clock | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"`fn` must be callable (the model function). Found: {shorten(fn)}.")
        if not (isinstance(collate, bool) or callable(collate)):
            raise TypeError(f"`collate` must be a bool or a callable. Found: {shorten(collate)}.")
        if validate is not None and not callable(validate):
            raise TypeError(f"`validate` must be callable or None. Found: {shorten(validate)}.")
        self.config = BatcherConfig(
            max_batch_size=max_batch_size,
            max_delay_ms=max_delay_ms,
            max_queue=max_queue,
            max_concurrent_batches=max_concurrent_batches,
            max_latency_ms=max_latency_ms,
            preferred_batch_sizes=tuple(preferred_batch_sizes),
            default_timeout_s=default_timeout_s,
            close_timeout_s=close_timeout_s,
            name=name,
        )
        self.fn = fn
        self.max_batch_size = self.config.max_batch_size
        self.max_delay_ms = self.config.max_delay_ms
        self.max_queue = self.config.max_queue
        self.max_concurrent_batches = self.config.max_concurrent_batches
        self.max_latency_ms = self.config.max_latency_ms
        self.preferred_batch_sizes = self.config.preferred_batch_sizes
        self.default_timeout_s = self.config.default_timeout_s
        self.close_timeout_s = self.config.close_timeout_s
        self.name = self.config.name
        self.collate = collate
        self.validate = validate
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        collate_fn = _default_collate if collate is True else (collate or None)
        self._core = _Core(fn, self.config, self.clock, collate_fn)
        core = self._core
        core.threads.append(threading.Thread(target=core.schedule, name=SCHEDULER_THREAD_NAME, daemon=True))
        for i in range(self.config.max_concurrent_batches):
            core.threads.append(
                threading.Thread(target=core.serve_batches, name=MODEL_THREAD_NAME.format(i), daemon=True)
            )
        self._finalizer = weakref.finalize(self, core.shutdown, False, MAX_WAIT_S)
        for thread in core.threads:
            thread.start()

    def submit(self, x: Any, *, timeout_s: float | None = None) -> Future:
        """Queue one input; return a ``concurrent.futures.Future`` of its result. Any thread.

        ``timeout_s`` (default ``default_timeout_s``) is the request's deadline from now: if
        its batch has not started by then it fails with ``TimeoutError`` without running.
        Cancelling the future before its batch starts removes it from the queue.

        Raises:
            Overloaded: ``max_queue`` requests are already waiting, or (with ``max_latency_ms``)
                this one's predicted latency exceeds it.
            BatcherClosedError: ``close()`` was called.
            ValueError: ``timeout_s`` is not a number > 0.
        """
        if timeout_s is None:
            timeout_s = self.config.default_timeout_s
        elif isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"`timeout_s` must be a number > 0 (seconds) or None. Found: {shorten(timeout_s)}.")
        core = self._core
        future: Future = Future()
        if self.validate is not None:
            try:
                self.validate(x)
            except Exception as exc:
                with core.cond:
                    closed = core.closing
                if not closed:
                    core.stats.add("requests")
                    core.stats.add("invalid")
                    add_note(exc, f"gpufeed.serve: rejected by validate() of DynamicBatcher {self.name!r}")
                    future.set_exception(exc)
                    return future
        with core.cond:
            if core.closing:
                raise BatcherClosedError(f"DynamicBatcher {self.name!r} is closed; create a new one to serve again.")
            if len(core.queue) >= self.config.max_queue:
                core.drop_cancelled()
            if len(core.queue) >= self.config.max_queue:
                core.stats.add("rejected")
                raise Overloaded(
                    f"DynamicBatcher {self.name!r} is overloaded: {len(core.queue)} requests queued, "
                    f"max_queue={self.config.max_queue}. Retry later (HTTP 503), or raise `max_queue` "
                    "or `max_concurrent_batches` if the model keeps up."
                )
            now = self.clock.now()
            if self.config.max_latency_ms is not None:
                core.check_latency(now)
            deadline = math.inf if timeout_s is None else now + timeout_s
            core.queue.append(_Request(x, future, now, deadline, timeout_s))
            core.stats.add("requests")
            # Wake the scheduler only when this request changes what it waits for: the first
            # request starts the oldest-request timer, a full batch may go now, an earlier
            # deadline moves its wake-up. (One wake-up per request cost a thread switch and a
            # GIL hand-off each, taken from the model threads.)
            depth = len(core.queue)
            if depth == 1 or depth == self.config.max_batch_size or deadline < core.next_expiry:
                core.cond.notify()
            core.next_expiry = min(core.next_expiry, deadline)
        future.add_done_callback(core.on_done)
        return future

    async def infer(self, x: Any, *, timeout_s: float | None = None) -> Any:
        """``await`` the result of ``x`` from asyncio. Cancelling the awaiting task cancels the
        request (dropped if its batch has not started). Raises as :meth:`submit` and the model do."""
        return await asyncio.wrap_future(self.submit(x, timeout_s=timeout_s))

    def stats(self) -> dict[str, Any]:
        """A snapshot: counters, gauges, quantiles and histograms.

        Keys: ``requests``, ``rejected`` (of which ``rejected_latency``: over ``max_latency_ms``),
        ``expired``, ``cancelled``, ``invalid``, ``completed``,
        ``failed``, ``batches`` (counts since creation); ``queue_depth`` (requests waiting),
        ``running_batches``; ``batch_size_mean``; ``queue_wait_p50_s``, ``queue_wait_p99_s``,
        ``latency_p50_s``, ``latency_p99_s`` (seconds, from the histograms; NaN before the first
        request); ``batch_size_hist``, ``queue_wait_s_hist``, ``latency_s_hist`` (each
        ``{"bounds", "counts", "sum", "count"}``, see :class:`Histogram`).
        """
        out = self._core.stats.snapshot()
        with self._core.cond:
            out["queue_depth"] = len(self._core.queue)
            out["running_batches"] = self.config.max_concurrent_batches - self._core.free_slots
        return out

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return not self._finalizer.alive

    def close(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop accepting requests and end the threads (idempotent).

        ``drain=True`` (default): every queued request is dispatched at once (no timer), and
        close waits for all batches, up to ``timeout_s`` (default ``close_timeout_s``); requests
        still queued after that are cancelled. ``drain=False``: queued requests are cancelled at
        once; running batches finish. A model function still running after the timeout is left
        to finish in its daemon thread, with a warning.
        """
        if not self._finalizer.alive:
            return
        self._finalizer.detach()
        self._core.shutdown(drain, self.config.close_timeout_s if timeout_s is None else timeout_s)

    def __enter__(self) -> DynamicBatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "serving"
        return (
            f"DynamicBatcher({self.name!r}, {state}, max_batch_size={self.max_batch_size}, "
            f"max_delay_ms={self.max_delay_ms}, max_queue={self.max_queue})"
        )
