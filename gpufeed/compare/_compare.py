"""Compare loaders on one machine in one run: alternating rounds, medians, ratios, peak PSS.

The machine is shared and noisy, so a lone timing means little; what a result quotes is the
*ratio* of medians measured in the same run, with the loaders' rounds interleaved
(warm-up A, B; then A, B, A, B, ...) so that drift in the machine's load hits both alike.

Each round builds a fresh loader from its factory, iterates ``num_batches`` batches (or one
epoch), consumes each batch minimally (by default one byte per memory page, see
:func:`touch_pages`: transport is measured, not compute, yet every page handed over is mapped and
counted), then drops the iterator and the loader and waits for their worker processes to exit
before the next round.
"""

from __future__ import annotations

import gc
import mmap
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import psutil
import torch

from gpufeed._engine.signals import sigint_held
from gpufeed._observe.batches import batch_size_of
from gpufeed._observe.memory import PeakPSS
from gpufeed.compare._results import CompareResult, LoaderSummary, RoundResult
from gpufeed.errors import shorten

__all__ = [
    "CompareResult",
    "LoaderFactory",
    "LoaderSummary",
    "RoundResult",
    "batch_size_of",
    "compare",
    "stop_workers",
    "touch_batch",
    "touch_pages",
]

LoaderFactory = Callable[[], Iterable[Any]]
"""Builds a fresh loader (anything iterable) each time it is called."""


def touch_batch(batch: Any) -> Any:
    """Reads one element of the first tensor/array in ``batch`` (no copy); returns it.

    Enough to fail on a bad buffer, cheap enough to leave transport as the thing measured.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            return batch.item() if hasattr(batch, "item") else batch
        if all(d > 0 for d in shape):
            element = batch[(0,) * len(shape)]
            return element.item() if hasattr(element, "item") else element
        return None
    if isinstance(batch, Mapping):
        return touch_batch(next(iter(batch.values()))) if batch else None
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return touch_batch(batch[0]) if batch else None
    return batch


def _tensors(batch: Any) -> Iterator[Any]:
    """Every tensor/array in a (nested) batch, depth-first."""
    if getattr(batch, "shape", None) is not None:
        yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)


def touch_pages(batch: Any) -> int:
    """Reads one byte in every memory page of every tensor in ``batch``; returns the bytes covered.

    The main process thereby maps every page it was handed, as a real consumer (a host-to-device
    copy, a normalize) would: page faults are paid, and the pages count in this process's PSS.
    Compute stays negligible (one read per 4 KiB). Channels_last tensors are read through their
    NHWC view (they were once left unmapped, which flattered channels_last output); other
    non-contiguous tensors get one element read.
    """
    covered = 0
    for t in _tensors(batch):
        if (isinstance(t, torch.Tensor) and t.dim() == 4 and t.numel() > 0
                and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)):
            t = t.permute(0, 2, 3, 1)  # channels_last memory: the same pages, as a contiguous view
        if isinstance(t, torch.Tensor) and t.is_contiguous() and t.numel() > 0:
            flat = t.reshape(-1)
            step = max(1, mmap.PAGESIZE // t.element_size())
            flat[::step].sum()
            covered += t.numel() * t.element_size()
        else:
            touch_batch(t)
    return covered


def _run_round(
    name: str,
    factory: LoaderFactory,
    round_index: int,
    num_batches: int | None,
    consume: Callable[[Any], Any],
    sample_interval_s: float,
    sampler_cpu_share: float | None,
    teardown_timeout_s: float,
    notes: list[str],
    clock: Callable[[], float],
) -> RoundResult:
    """Builds a loader, iterates it under a :class:`PeakPSS`, tears it down; one RoundResult."""
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    gc.collect()
    n_batches = 0
    n_samples = 0
    first_batch_at = 0.0
    first_samples = 0
    cpu = _TreeCpu(me)
    arrivals: list[float] = []  # each batch's time once consumed
    loader: Iterable[Any] | None = None
    iterator: Iterator[Any] | None = None
    with PeakPSS(interval_s=sample_interval_s, cpu_share=sampler_cpu_share) as mem:
        t0 = clock()
        try:
            loader = factory()
            with sigint_held():  # workers start here: none is interrupted before it ignores Ctrl-C
                iterator = iter(loader)
            for batch in iterator:
                consume(batch)
                n_samples += batch_size_of(batch)
                n_batches += 1
                arrivals.append(clock())
                del batch
                if n_batches > 1:
                    cpu.update()  # throttled
                if n_batches == 1:
                    cpu.start()  # before the clock: its cost is not steady time
                    first_samples = n_samples
                    first_batch_at = clock()
                    mem.request()  # the workers are up: sample now, whatever the budget
                if num_batches is not None and n_batches >= num_batches:
                    break
            t_end = clock()
            parent_cpu_s = cpu.parent_s()
        except BaseException:
            # Ctrl-C or an error: the traceback keeps the iterator alive, so dropping it would
            # not stop its workers, and waiting for them would take teardown_timeout_s. Stop
            # them now and leave without waiting.
            stop_workers(iterator)
            iterator = loader = None
            raise
        # Leaving the sampler running while workers shut down would charge teardown memory
        # to this round; that is fine (it is still this loader's memory).
        t_td = time.perf_counter()
        iterator = loader = None
        gc.collect()
        teardown_s = _wait_children_gone(me, children_before, teardown_timeout_s)
        if teardown_s is None:
            notes.append(
                f"{name} round {round_index}: worker processes still alive "
                f"{teardown_timeout_s:.0f}s after the loader was dropped"
            )
            teardown_s = time.perf_counter() - t_td
        workers_cpu_s = cpu.workers_s()
    if n_batches == 0:
        raise ValueError(f"loader {name!r} yielded no batches")
    if num_batches is not None and n_batches < num_batches:
        notes.append(f"{name} round {round_index}: epoch ended after {n_batches} of {num_batches} batches")
    startup_s = (first_batch_at - t0) if n_batches else 0.0
    steady_s = t_end - first_batch_at
    return RoundResult(
        loader=name,
        round_index=round_index,
        num_batches=n_batches,
        num_samples=n_samples,
        startup_s=startup_s,
        steady_s=steady_s,
        total_s=startup_s + steady_s,
        peak_pss_bytes=mem.peak_bytes,
        mean_pss_bytes=mem.mean_bytes,
        peak_footprint_bytes=mem.peak_footprint_bytes,
        teardown_s=teardown_s,
        steady_samples=n_samples - first_samples,
        cpu_s=parent_cpu_s + workers_cpu_s,
        parent_cpu_s=parent_cpu_s,
        fitted_batches_per_s=fitted_rate(arrivals),
    )


def fitted_rate(arrivals: Sequence[float]) -> float:
    """Batches per second: the least-squares slope of batch number against arrival time
    (``RoundResult.batches_per_s`` says why); 0.0 with fewer than 2 arrivals or no time between
    them."""
    n = len(arrivals)
    if n < 2:
        return 0.0
    t_mean = statistics.fmean(arrivals)
    k_mean = (n - 1) / 2
    spread = sum((t - t_mean) ** 2 for t in arrivals)
    if spread <= 0:
        return 0.0
    return sum((t - t_mean) * (k - k_mean) for k, t in enumerate(arrivals)) / spread


class _TreeCpu:
    """CPU seconds (user + system) of this process from :meth:`start` to :meth:`parent_s`, and
    of its descendants from :meth:`start` to :meth:`workers_s` (called once they are gone).

    A direct child that has exited and been reaped (a worker at the end of its epoch) is counted
    through this process's reaped-children time, which then holds its whole life: its CPU at
    :meth:`start` is taken off. Any other descendant counts from its readings at :meth:`start`
    and its last one (:meth:`update`, at most every ``UPDATE_S``; a zombie's is still
    readable). A child started and reaped during the round (a replaced worker) is counted whole;
    a grandchild started then is not."""

    UPDATE_S = 0.05  # one /proc read per descendant (~20 us): not after every batch of a fast loader

    def __init__(self, me: psutil.Process) -> None:
        self.me = me
        self.own: float | None = None  # None until start()
        self.reaped = 0.0
        self.kids: list[psutil.Process] = []
        self.direct: set[int] = set()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.read_at = 0.0

    @staticmethod
    def _seconds(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return times.user + times.system

    def start(self) -> None:
        times = self.me.cpu_times()
        self.own, self.reaped = times.user + times.system, times.children_user + times.children_system
        for child in self.me.children(recursive=True):
            try:
                self.first[child.pid] = self.last[child.pid] = self._seconds(child)
                if child.ppid() == self.me.pid:
                    self.direct.add(child.pid)
            except psutil.Error:
                continue
            self.kids.append(child)
        self.read_at = time.perf_counter()

    def update(self, force: bool = False) -> None:
        if self.own is None or not (force or time.perf_counter() - self.read_at >= self.UPDATE_S):
            return
        for child in self.kids:
            try:
                self.last[child.pid] = self._seconds(child)
            except psutil.Error:
                continue  # gone: its last reading stands
        self.read_at = time.perf_counter()

    def parent_s(self) -> float:
        """This process's CPU seconds since :meth:`start` (0.0 without one)."""
        if self.own is None:
            return 0.0
        self.update(force=True)
        return self._seconds(self.me) - self.own

    def workers_s(self) -> float:
        """The descendants' CPU seconds since :meth:`start` (0.0 without one), their exits
        included."""
        if self.own is None:
            return 0.0
        times = self.me.cpu_times()
        total = times.children_user + times.children_system - self.reaped
        for child in self.kids:
            pid = child.pid
            try:
                child.status()
            except psutil.NoSuchProcess:
                if pid in self.direct:  # reaped: its whole life is in `total`
                    total -= self.first[pid]
                    continue
            try:
                self.last[pid] = self._seconds(child)
            except psutil.Error:
                pass
            total += self.last[pid] - self.first[pid]
        return total


def stop_workers(iterator: Iterator[Any] | None) -> None:
    """Stops an interrupted iterator's workers now: ``close()`` (gpufeed) or torch's
    ``_shutdown_workers()``; errors while stopping are ignored (the original one propagates)."""
    stop = getattr(iterator, "close", None) or getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _wait_children_gone(me: psutil.Process, before: set[int], timeout_s: float) -> float | None:
    """Waits until the descendants that were not in ``before`` have exited; seconds, or None."""
    t0 = time.perf_counter()
    while True:
        try:
            alive = any(
                p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
                for p in me.children(recursive=True)
            )
        except psutil.NoSuchProcess:
            alive = True  # a child vanished while being listed: look again
        waited = time.perf_counter() - t0
        if not alive:
            return waited
        if waited > timeout_s:
            return None
        time.sleep(0.01)


def compare(
    factories: Mapping[str, LoaderFactory],
    *,
    num_batches: int | None = None,
    num_rounds: int = 5,
    num_warmup_rounds: int = 1,
    baseline: str | None = None,
    consume: Callable[[Any], Any] = touch_pages,
    sample_interval_s: float = 0.05,
    sampler_cpu_share: float | None = 0.03,
    teardown_timeout_s: float = 30.0,
    environment: Mapping[str, Any] | None = None,
    rotate: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> CompareResult:
    """Runs the loaders in alternating rounds and summarises them.

    Args:
        factories: name -> callable building a fresh loader (e.g. ``lambda: DataLoader(ds, ...)``),
            in the order they run within a round.
        num_batches: batches per round; None: one full epoch.
        num_rounds: counted rounds per loader (medians are taken over these).
        num_warmup_rounds: uncounted rounds per loader run first (imports, page cache, allocator).
        baseline: the loader ratios are relative to (default: the first factory).
        consume: called on every batch (default: :func:`touch_pages`, one byte per page;
            :func:`touch_batch` reads one element only, leaving unread pages unmapped and
            so uncounted in PSS).
        sample_interval_s: PSS sampling period in seconds (the shortest: see ``sampler_cpu_share``).
        sampler_cpu_share: the most of one core the PSS sampler may take from the loaders it
            measures (:class:`PeakPSS`'s ``cpu_share``; None: no cap). A sample of a loader's
            process tree costs 27-33 ms of CPU, so uncapped 50 ms sampling took 20-25% off
            every loader's images/s on a 2-core machine; capped at 3%, a round samples on
            entry, at its first batch, every second or so, and on exit.
        teardown_timeout_s: how long to wait for a dropped loader's processes to exit.
        environment: stored in the result as is (see ``describe_environment``).
        rotate: start round ``i`` at loader ``i mod len(factories)`` (then on in the given
            order, wrapping around), so that every loader takes every place in a round; a loader
            that always runs right after another pays for what that one leaves behind.
        clock: seconds, for the rounds' start-up and steady timings (a test passes a manual
            clock to fix what each batch costs); teardown waits always run on real time.

    Returns:
        A :class:`CompareResult` (``format_table()`` for people, ``to_dict()`` for files).
    """
    if len(factories) < 1:
        raise ValueError("`factories` must name at least one loader. Found: none.")
    if num_rounds < 1:
        raise ValueError(f"`num_rounds` must be >= 1. Found: {num_rounds}.")
    if num_warmup_rounds < 0:
        raise ValueError(f"`num_warmup_rounds` must be >= 0. Found: {num_warmup_rounds}.")
    if num_batches is not None and num_batches < 2:
        raise ValueError(
            f"`num_batches` must be >= 2 (the first batch is start-up) or None. Found: {num_batches}."
        )
    names = list(factories)
    base = names[0] if baseline is None else baseline
    if base not in factories:
        raise ValueError(f"`baseline` must be one of {names}. Found: {shorten(baseline)}.")

    notes: list[str] = []
    rounds: dict[str, list[RoundResult]] = {n: [] for n in names}
    for i in range(num_warmup_rounds + num_rounds):
        shift = i % len(names) if rotate else 0
        for name in names[shift:] + names[:shift]:
            r = _run_round(
                name, factories[name], i - num_warmup_rounds, num_batches, consume,
                sample_interval_s, sampler_cpu_share, teardown_timeout_s, notes, clock,
            )
            if i >= num_warmup_rounds:
                rounds[name].append(r)
    return CompareResult(
        loaders=tuple(LoaderSummary(n, tuple(rounds[n])) for n in names),
        baseline=base,
        num_rounds=num_rounds,
        num_warmup_rounds=num_warmup_rounds,
        num_batches=num_batches,
        environment=dict(environment or {}),
        notes=tuple(notes),
        rotated=rotate,
    )
