"""Memory of a process tree, measured as PSS.

A loader's workers share memory with the main process (an arena, torch's shared-memory batches,
copy-on-write pages of the dataset). Summing RSS over the processes counts every shared page
once per process that maps it; summing PSS (proportional set size: a page shared by *n*
processes counts 1/n in each) counts it once. So :class:`PeakPSS` sums PSS over the current
process and all its descendants.

Sources, best first: ``/proc/PID/smaps_rollup`` (Linux >= 4.14, cheap), psutil's
``memory_full_info().pss`` (walks ``/proc/PID/smaps``), then RSS where PSS cannot be read
(the figure is then an over-estimate for shared memory; :attr:`PeakPSS.source` says which).

Memory that no process maps (e.g. a ``/dev/shm`` file nobody has open) is not counted.
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

import psutil

__all__ = ["PeakPSS", "format_bytes", "process_pss_bytes", "tree_pss_bytes"]

SAMPLER_THREAD_NAME = "gpufeed-pss-sampler"

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError, FileNotFoundError)
# Weakest source first: a total is only as good as its weakest term.
_SOURCE_RANK = {"rss": 0, "psutil": 1, "smaps_rollup": 2, "n/a": 3}


def _smaps_rollup_pss_bytes(pid: int) -> int | None:
    """PSS of ``pid`` in bytes from ``/proc/PID/smaps_rollup``, or None if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        # A kernel without smaps_rollup, no permission, or the process is gone; the caller's
        # fallback tells the last case apart (psutil.NoSuchProcess).
        return None
    return None


def process_pss_bytes(pid: int) -> tuple[int, str]:
    """Memory of one process in bytes, and its source: ``"smaps_rollup"``, ``"psutil"`` or ``"rss"``.

    Raises ``psutil.NoSuchProcess`` when the process is gone.
    """
    pss = _smaps_rollup_pss_bytes(pid)
    if pss is not None:
        return pss, "smaps_rollup"
    proc = psutil.Process(pid)
    try:
        return int(proc.memory_full_info().pss), "psutil"
    except (psutil.AccessDenied, AttributeError):
        # AttributeError: a platform whose memory_full_info() has no pss field (macOS).
        return int(proc.memory_info().rss), "rss"


def tree_pss_bytes(pid: int | None = None) -> tuple[int, int, str]:
    """PSS summed over ``pid`` (default: this process) and all its descendants.

    Returns ``(bytes, number of processes counted, weakest source used)``. Processes that exit
    while being measured are skipped.
    """
    root_pid = os.getpid() if pid is None else pid
    root = psutil.Process(root_pid)
    try:
        children = root.children(recursive=True)
    except _GONE:
        children = []
    total_bytes = 0
    num_processes = 0
    sources: set[str] = set()
    for child_pid in [root_pid, *(c.pid for c in children)]:
        try:
            nbytes, source = process_pss_bytes(child_pid)
        except _GONE:
            continue
        total_bytes += nbytes
        num_processes += 1
        sources.add(source)
    weakest = min(sources, key=_SOURCE_RANK.__getitem__, default="n/a")
    return total_bytes, num_processes, weakest


class PeakPSS:
    """Samples the PSS of this process tree in a background thread; records peak and mean.

    Use as a context manager (or :meth:`start`/:meth:`stop`)::

        with PeakPSS() as mem:
            run()
        mem.peak_bytes, mem.mean_bytes

    One sample is taken synchronously on entry and one on exit, so even a short block has two.
    The thread is named ``gpufeed-pss-sampler``, is a daemon, and is joined on exit.

    Args:
        interval_s: seconds between samples (default 0.05).
        pid: root of the process tree (default: this process).
    """

    def __init__(self, interval_s: float = 0.05, pid: int | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"`interval_s` must be > 0. Found: {interval_s!r}.")
        self.interval_s = float(interval_s)
        self.pid = os.getpid() if pid is None else pid
        self.peak_bytes = 0
        self.baseline_bytes = 0  # the first sample, taken on entry
        self.final_bytes = 0  # the last sample, taken on exit
        self.max_processes = 0
        self.num_samples = 0
        self.source = "n/a"
        self._sum_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def mean_bytes(self) -> float:
        """Mean of the samples in bytes (0.0 before any sample)."""
        with self._lock:
            return self._sum_bytes / self.num_samples if self.num_samples else 0.0

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None

    def sample(self) -> int:
        """Takes one sample now and returns it (bytes)."""
        nbytes, nproc, source = tree_pss_bytes(self.pid)
        with self._lock:
            if self.num_samples == 0:
                self.baseline_bytes = nbytes
            self.num_samples += 1
            self._sum_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, nbytes)
            self.max_processes = max(self.max_processes, nproc)
            self.final_bytes = nbytes
            self.source = min(self.source, source, key=_SOURCE_RANK.__getitem__)
        return nbytes

    def start(self) -> PeakPSS:
        """Takes a first sample and starts the sampler thread."""
        if self._thread is not None:
            raise RuntimeError("PeakPSS is already running; call stop() first.")
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name=SAMPLER_THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops and joins the sampler thread, then takes a last sample. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakPSS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def to_dict(self) -> dict[str, float | int | str]:
        """The figures as plain data (bytes, counts)."""
        return {
            "peak_bytes": self.peak_bytes,
            "mean_bytes": self.mean_bytes,
            "baseline_bytes": self.baseline_bytes,
            "final_bytes": self.final_bytes,
            "num_samples": self.num_samples,
            "max_processes": self.max_processes,
            "interval_s": self.interval_s,
            "source": self.source,
        }


def format_bytes(num_bytes: float) -> str:
    """Human-readable size with binary units, e.g. ``format_bytes(3 * 2**20) == '3.0 MiB'``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
