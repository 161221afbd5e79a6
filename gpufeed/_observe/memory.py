"""Memory of a process tree, measured as PSS.

A loader's workers share memory with the main process (an arena, torch's shared-memory batches,
copy-on-write pages of the dataset). Summing RSS over the processes counts every shared page
once per process that maps it; summing PSS (proportional set size: a page shared by *n*
processes counts 1/n in each) counts it once. So :class:`PeakPSS` sums PSS over the current
process and all its descendants.

Sources, best first: ``/proc/PID/smaps_rollup`` (Linux >= 4.14, cheap), psutil's
``memory_full_info().pss`` (walks ``/proc/PID/smaps``), then RSS where PSS cannot be read
(the figure is then an over-estimate for shared memory; :attr:`PeakPSS.source` says which).

PSS misses shared memory that exists but that no process has mapped (or touched): torch's
DataLoader keeps prefetched batches in shared-memory files the main process maps lazily, so a
consumer that never reads them leaves those pages out of every PSS. :class:`PeakPSS` therefore
also records a *footprint*: the tree's PSS with its shared-memory part (``Pss_Shmem``) replaced by
the growth of the system's ``Shmem`` (``/proc/meminfo``) since the sampler started, which counts
every shared page created meanwhile once, mapped or not. Other processes creating shared memory
during the measurement inflate it; on a quiet machine it is the fairer figure.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from types import TracebackType

import psutil

from gpufeed.errors import shorten

__all__ = [
    "PeakPSS",
    "TreeMemory",
    "format_bytes",
    "process_pss_bytes",
    "sampler_wait",
    "system_shmem_bytes",
    "tree_memory",
    "tree_pss_bytes",
]

SAMPLER_THREAD_NAME = "gpufeed-pss-sampler"

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError, FileNotFoundError)
# Weakest source first: a total is only as good as its weakest term.
_SOURCE_RANK = {"rss": 0, "psutil": 1, "smaps_rollup": 2, "n/a": 3}


@dataclass(frozen=True)
class TreeMemory:
    """One reading of a process tree. Bytes; ``pss_shmem_bytes`` is None where unreadable."""

    pss_bytes: int
    pss_shmem_bytes: int | None
    num_processes: int
    source: str  # the weakest source used: "smaps_rollup", "psutil", "rss" or "n/a"


def _smaps_rollup(pid: int) -> tuple[int, int | None] | None:
    """``(Pss, Pss_Shmem)`` of ``pid`` in bytes from ``/proc/PID/smaps_rollup``, or None."""
    pss: int | None = None
    pss_shmem: int | None = None
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024  # the kernel reports kB
                elif line.startswith(b"Pss_Shmem:"):
                    pss_shmem = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        # A kernel without smaps_rollup, no permission, or the process is gone; the caller's
        # fallback tells the last case apart (psutil.NoSuchProcess).
        return None
    return None if pss is None else (pss, pss_shmem)


def process_pss_bytes(pid: int) -> tuple[int, str]:
    """Memory of one process in bytes, and its source: ``"smaps_rollup"``, ``"psutil"`` or ``"rss"``.

    Raises ``psutil.NoSuchProcess`` when the process is gone.
    """
    nbytes, _, source = _process_memory(pid)
    return nbytes, source


def _process_memory(pid: int) -> tuple[int, int | None, str]:
    """``(pss bytes, pss_shmem bytes or None, source)`` of one process."""
    rollup = _smaps_rollup(pid)
    if rollup is not None:
        return rollup[0], rollup[1], "smaps_rollup"
    proc = psutil.Process(pid)
    try:
        return int(proc.memory_full_info().pss), None, "psutil"
    except (psutil.AccessDenied, AttributeError):
        # AttributeError: a platform whose memory_full_info() has no pss field (macOS).
        return int(proc.memory_info().rss), None, "rss"


def tree_memory(pid: int | None = None) -> TreeMemory:
    """PSS (and its shared-memory part) summed over ``pid`` (default: this process) and all its
    descendants. Processes that exit while being measured are skipped."""
    root_pid = os.getpid() if pid is None else pid
    root = psutil.Process(root_pid)
    try:
        children = root.children(recursive=True)
    except _GONE:
        children = []
    total_bytes = 0
    shmem_bytes: int | None = 0
    num_processes = 0
    sources: set[str] = set()
    for child_pid in [root_pid, *(c.pid for c in children)]:
        try:
            nbytes, nshmem, source = _process_memory(child_pid)
        except _GONE:
            continue
        total_bytes += nbytes
        shmem_bytes = None if shmem_bytes is None or nshmem is None else shmem_bytes + nshmem
        num_processes += 1
        sources.add(source)
    weakest = min(sources, key=_SOURCE_RANK.__getitem__, default="n/a")
    return TreeMemory(total_bytes, shmem_bytes, num_processes, weakest)


def tree_pss_bytes(pid: int | None = None) -> tuple[int, int, str]:
    """PSS summed over ``pid`` (default: this process) and all its descendants.

    Returns ``(bytes, number of processes counted, weakest source used)``.
    """
    m = tree_memory(pid)
    return m.pss_bytes, m.num_processes, m.source


def system_shmem_bytes(meminfo_path: str = "/proc/meminfo") -> int | None:
    """The system's shared memory in bytes (``Shmem:`` of ``/proc/meminfo``: tmpfs, memfd, shared
    anonymous pages, mapped or not), or None where unreadable."""
    try:
        with open(meminfo_path, "rb") as f:
            for line in f:
                if line.startswith(b"Shmem:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def sampler_wait(interval_s: float, cost_s: float, cpu_share: float | None) -> float:
    """Seconds a sampler waits after a sample that cost ``cost_s`` seconds of CPU: ``interval_s``,
    or longer where that would spend more than ``cpu_share`` of a core on sampling."""
    if cpu_share is None:
        return interval_s
    return max(interval_s, cost_s / cpu_share - cost_s)


class PeakPSS:
    """Samples the PSS of this process tree in a background thread; records peak and mean.

    Use as a context manager (or :meth:`start`/:meth:`stop`)::

        with PeakPSS() as mem:
            run()
        mem.peak_bytes, mem.mean_bytes, mem.peak_footprint_bytes

    ``peak_footprint_bytes`` is the peak of PSS with shared memory counted whole, mapped or not
    (see the module docstring); it equals ``peak_bytes`` where ``Pss_Shmem`` or ``Shmem`` cannot
    be read (``footprint_exact`` is then False).

    One sample is taken synchronously on entry and one on exit, so even a short block has two;
    :meth:`request` asks the thread for one more at once (e.g. when a loader's workers are up).
    The thread is named ``gpufeed-pss-sampler``, is a daemon, and is joined on exit.

    A sample is not free: the kernel walks every mapping of every process for ``smaps_rollup``,
    27-33 ms of CPU for a loader with two workers (torch imported, an arena mapped), so sampling
    every 50 ms took a quarter of a core from the loader being measured. ``cpu_share`` caps that:
    after a sample that cost ``c`` seconds of the thread's CPU, the next waits at least
    ``c / cpu_share - c`` (:func:`sampler_wait`). ``sampler_cpu_s`` is what sampling cost.

    Args:
        interval_s: seconds between samples (default 0.05).
        pid: root of the process tree (default: this process).
        cpu_share: the most of one core the thread may spend sampling (0-1]; None: no cap.
    """

    def __init__(self, interval_s: float = 0.05, pid: int | None = None,
                 cpu_share: float | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"`interval_s` must be > 0. Found: {shorten(interval_s)}.")
        if cpu_share is not None and not 0 < cpu_share <= 1:
            raise ValueError(f"`cpu_share` must be in (0, 1] or None. Found: {shorten(cpu_share)}.")
        self.interval_s = float(interval_s)
        self.cpu_share = cpu_share
        self.sampler_cpu_s = 0.0
        self.pid = os.getpid() if pid is None else pid
        self.peak_bytes = 0
        self.baseline_bytes = 0  # the first sample, taken on entry
        self.final_bytes = 0  # the last sample, taken on exit
        self.max_processes = 0
        self.num_samples = 0
        self.source = "n/a"
        self.peak_footprint_bytes = 0
        self.footprint_exact = True
        self._shm_start: int | None = None
        self._tree_shmem_start: int | None = None
        self._sum_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, or a request
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
        """Takes one sample now and returns its PSS (bytes)."""
        m = tree_memory(self.pid)
        shm = system_shmem_bytes()
        with self._lock:
            if self.num_samples == 0:
                self.baseline_bytes = m.pss_bytes
                self._shm_start = shm
                self._tree_shmem_start = m.pss_shmem_bytes
            if m.pss_shmem_bytes is None or shm is None or self._shm_start is None or self._tree_shmem_start is None:
                footprint = m.pss_bytes
                self.footprint_exact = False
            else:
                # Shared memory: what the tree had mapped at the start plus all the system gained
                # since, but never less than what the tree has mapped now.
                shared = max(m.pss_shmem_bytes, self._tree_shmem_start + shm - self._shm_start)
                footprint = m.pss_bytes - m.pss_shmem_bytes + shared
            self.num_samples += 1
            self._sum_bytes += m.pss_bytes
            self.peak_bytes = max(self.peak_bytes, m.pss_bytes)
            self.peak_footprint_bytes = max(self.peak_footprint_bytes, footprint)
            self.max_processes = max(self.max_processes, m.num_processes)
            self.final_bytes = m.pss_bytes
            self.source = min(self.source, m.source, key=_SOURCE_RANK.__getitem__)
        return m.pss_bytes

    def start(self) -> PeakPSS:
        """Takes a first sample and starts the sampler thread."""
        if self._thread is not None:
            raise RuntimeError("PeakPSS is already running; call stop() first.")
        self._stop.clear()
        self._wake.clear()
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
        self._wake.set()
        thread.join()
        self.sample()

    def request(self) -> None:
        """Has the thread take a sample now, whatever ``interval_s`` and ``cpu_share`` say."""
        self._wake.set()

    def _run(self) -> None:
        wait = self.interval_s
        while True:
            self._wake.wait(wait)
            if self._stop.is_set():
                return
            self._wake.clear()
            start = time.thread_time()
            self.sample()
            cost = time.thread_time() - start
            self.sampler_cpu_s += cost
            wait = sampler_wait(self.interval_s, cost, self.cpu_share)

    def __enter__(self) -> PeakPSS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def to_dict(self) -> dict[str, float | int | str | bool]:
        """The figures as plain data (bytes, counts)."""
        return {
            "peak_bytes": self.peak_bytes,
            "mean_bytes": self.mean_bytes,
            "peak_footprint_bytes": self.peak_footprint_bytes,
            "footprint_exact": self.footprint_exact,
            "baseline_bytes": self.baseline_bytes,
            "final_bytes": self.final_bytes,
            "num_samples": self.num_samples,
            "max_processes": self.max_processes,
            "interval_s": self.interval_s,
            "sampler_cpu_s": self.sampler_cpu_s,
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
