"""Process-tree and system measurements for ``gpufeed.doctor``, taken while a loader runs.

:class:`TreeProbe` measures, between ``start()`` and ``stop()``:

* CPU seconds (user + system) of this process, of each worker pid it was told about, and of the
  whole process tree (psutil ``cpu_times`` deltas; a pid that appears later starts from zero, a
  pid that ends keeps its last reading, refreshed every ``cpu_every_s``);
* system CPU time over the CPUs this process may run on (``/proc/stat`` via psutil, per CPU):
  busy, idle and iowait core-seconds, and the cgroup's CPU quota and usage when one is set;
* thread states of the workers, sampled every ``interval_s`` from ``/proc/PID/task/*/stat``
  (Linux only; elsewhere no samples): how often a worker's main thread was running or runnable
  (R), blocked (S, D), and how often any of its threads was in uninterruptible I/O sleep (D).

The sampler is one thread, ``gpufeed-doctor-sampler``, joined by ``stop()``. Worker pids are
handed over by the caller's thread (``set_workers``), so the sampler never touches the loader.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from gpufeed._engine.context import cgroup_path, cgroup_quota_cores, usable_cpus


@dataclass
class ProbeResult:
    """What a probe measured. CPU figures are core-seconds over ``wall_s`` (wall seconds)."""

    wall_s: float
    usable_cores: float  # CPUs in this process's affinity, capped by a cgroup CPU quota
    main_cpu_s: float  # this process
    tree_cpu_s: float  # this process and every descendant (workers, forkserver, ...)
    worker_cpu_s: dict[int, float] = field(default_factory=dict)  # pid -> CPU seconds
    # pid -> worker id: a replaced worker, or a new iterator's, keeps its predecessor's id
    worker_ids: dict[int, int] = field(default_factory=dict)
    system_busy_s: float = 0.0  # core-seconds not idle/iowait on the usable CPUs (all processes)
    system_idle_s: float = 0.0  # core-seconds idle (iowait excluded)
    system_iowait_s: float = 0.0  # core-seconds idle with I/O outstanding
    cgroup_spare_s: float | None = None  # quota core-seconds the cgroup left unused, if capped
    state_samples: int = 0  # (sample, worker) pairs with a readable main-thread state
    running_samples: int = 0  # ... whose main thread was R (running or runnable)
    blocked_samples: int = 0  # ... whose main thread was S or D (waiting)
    dstate_samples: int = 0  # ... with any thread in D (uninterruptible, usually disk I/O)


def _core_capacity() -> float:
    """Cores of CPU time this process may use per second: its affinity CPUs, capped by the cgroup
    CPU quota (so possibly fractional: a 1.5-core quota on 8 CPUs gives 1.5; whole cores are
    :func:`gpufeed._engine.context.usable_cores`)."""
    cpus = float(len(usable_cpus()))
    quota = cgroup_quota_cores()
    return cpus if quota is None else min(cpus, quota)


def _cgroup_usage_s() -> float | None:
    try:
        with open(cgroup_path("cpu.stat")) as f:
            for line in f:
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


def _system_times(cpus: list[int]) -> tuple[float, float, float]:
    """(busy, idle, iowait) core-seconds since boot, summed over ``cpus``."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = idle = iowait = 0.0
    for cpu in cpus:
        if cpu >= len(per_cpu):
            continue
        t = per_cpu[cpu]
        wait = getattr(t, "iowait", 0.0)
        # guest time is already counted in user on Linux; leave it out of the total
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        idle += t.idle
        iowait += wait
        busy += total - t.idle - wait
    return busy, idle, iowait


def thread_states(pid: int) -> tuple[str | None, int]:
    """(state of the main thread, number of threads in D) of ``pid``; (None, 0) if unreadable."""
    task_dir = f"/proc/{pid}/task"
    main_state: str | None = None
    in_d = 0
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None, 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat", "rb") as f:
                raw = f.read()
        except OSError:  # the thread ended between listdir and open
            continue
        state = raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3].decode("ascii", "replace")
        in_d += state == "D"
        if tid == str(pid):
            main_state = state
    return main_state, in_d


class TreeProbe:
    """Measures this process tree and the system between ``start()`` and ``stop()``.

    ``interval_s``: seconds between thread-state samples; ``cpu_every_s``: seconds between CPU
    readings of each pid (only needed for pids that may end before ``stop()``).
    """

    def __init__(self, interval_s: float = 0.025, cpu_every_s: float = 0.25) -> None:
        if interval_s <= 0 or cpu_every_s <= 0:
            raise ValueError(f"`interval_s` and `cpu_every_s` must be > 0 seconds. "
                             f"Found: {interval_s}, {cpu_every_s}.")
        self.interval_s = interval_s
        self.cpu_every_s = cpu_every_s
        self._workers: tuple[int, ...] = ()
        self._procs: dict[int, psutil.Process] = {}
        self._base: dict[int, float] = {}  # pid -> CPU seconds at start (0 for later pids)
        self._last: dict[int, float] = {}  # pid -> latest CPU seconds seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counts = [0, 0, 0, 0]  # samples, running, blocked, D
        self._seen_workers: dict[int, int] = {}  # every worker pid handed over -> its worker id
        self._cpus = usable_cpus()

    # -- caller side ---------------------------------------------------------------------------
    def set_workers(self, pids: list[int]) -> None:
        """The worker pids to sample from now on (called from the loader's thread)."""
        self._workers = tuple(pids)

    def start(self) -> None:
        """Take the baselines and start the sampler thread."""
        if self._thread is not None:
            raise RuntimeError("gpufeed: a TreeProbe can be started once")
        self._t0 = time.perf_counter()
        self._sys0 = _system_times(self._cpus)
        self._cg0 = _cgroup_usage_s()
        self._main = psutil.Process()
        self._main0 = _cpu_s(self._main)
        for proc in self._tree():
            cpu = _cpu_s(proc)
            if cpu is not None:
                self._procs[proc.pid] = proc
                self._base[proc.pid] = self._last[proc.pid] = cpu
        self._thread = threading.Thread(target=self._run, name="gpufeed-doctor-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> ProbeResult:
        """Stop and join the sampler; the measurements since ``start()``."""
        if self._thread is None:
            raise RuntimeError("gpufeed: TreeProbe.stop() before start()")
        self._stop.set()
        self._thread.join()
        self._read_cpu()
        wall = time.perf_counter() - self._t0
        busy1, idle1, wait1 = _system_times(self._cpus)
        busy0, idle0, wait0 = self._sys0
        main = (_cpu_s(self._main) or 0.0) - (self._main0 or 0.0)
        with self._lock:
            deltas = {pid: self._last[pid] - self._base.get(pid, 0.0) for pid in self._last}
            samples, running, blocked, in_d = self._counts
        quota = cgroup_quota_cores()
        spare = None
        cg1 = _cgroup_usage_s()
        if quota is not None and self._cg0 is not None and cg1 is not None:
            spare = max(0.0, quota * wall - (cg1 - self._cg0))
        workers = {pid: deltas.get(pid, 0.0) for pid in self._seen_workers}
        return ProbeResult(
            wall_s=wall,
            usable_cores=_core_capacity(),
            main_cpu_s=main,
            tree_cpu_s=main + sum(d for pid, d in deltas.items() if pid != self._main.pid),
            worker_cpu_s=workers,
            worker_ids=dict(self._seen_workers),
            system_busy_s=max(0.0, busy1 - busy0),
            system_idle_s=max(0.0, idle1 - idle0),
            system_iowait_s=max(0.0, wait1 - wait0),
            cgroup_spare_s=spare,
            state_samples=samples,
            running_samples=running,
            blocked_samples=blocked,
            dstate_samples=in_d,
        )

    # -- sampler thread ------------------------------------------------------------------------
    def _run(self) -> None:
        next_cpu = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            workers = self._workers
            counts = [0, 0, 0, 0]
            for worker_id, pid in enumerate(workers):
                self._seen_workers.setdefault(pid, worker_id)
                state, in_d = thread_states(pid)
                if state is None:
                    continue
                counts[0] += 1
                counts[1] += state == "R"
                counts[2] += state in ("S", "D")
                counts[3] += in_d > 0
            with self._lock:
                self._counts = [a + b for a, b in zip(self._counts, counts)]
            if time.perf_counter() >= next_cpu:
                self._read_cpu()
                next_cpu = time.perf_counter() + self.cpu_every_s
        for worker_id, pid in enumerate(self._workers):
            self._seen_workers.setdefault(pid, worker_id)

    def _tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process().children(recursive=True)
        except psutil.Error:
            return []

    def _read_cpu(self) -> None:
        """Refresh every descendant's CPU seconds (new pids start from zero)."""
        for proc in self._tree():
            if proc.pid not in self._procs:
                self._procs[proc.pid] = proc
        for pid, proc in list(self._procs.items()):
            cpu = _cpu_s(proc)
            if cpu is None:
                continue
            with self._lock:
                self._last[pid] = cpu


def _cpu_s(proc: psutil.Process) -> float | None:
    """User + system CPU seconds of ``proc``, or None once it is gone."""
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system
