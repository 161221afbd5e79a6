"""How the local ranks of one job find each other: a small record per rank in a host-local
folder, and the CPUs each rank's workers take (docs/design/local-ranks.md).

A rank that knows its local rank (:func:`gpufeed._engine.ranks.find_local_ranks`) writes
``<tmp>/gpufeed-<uid>/ranks/<job>-<local rank>.json`` when its loader first starts workers:
its pid, the pid's start time and its CPU affinity at that moment. ``<job>`` is a hash of the
launcher's ``TORCHELASTIC_RUN_ID``, ``MASTER_ADDR`` and ``MASTER_PORT``. A record counts only
while its pid runs and started at the recorded time, so records of an earlier job are ignored
(and removed by the next rank that writes). Workers name themselves ``gpufeed-wK`` in
``/proc/PID/comm``, which is how the doctor counts another rank's workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from gpufeed._engine.ranks import LocalRanks, cpu_share

__all__ = ["WORKER_COMM_PREFIX", "HostRanks", "Placement", "RankRecord", "mark_worker", "pin_share", "workers_of"]

logger = logging.getLogger(__name__)

WORKER_COMM_PREFIX = "gpufeed-w"  # /proc/PID/comm of a worker: gpufeed-w0, gpufeed-w1, ...
RANKS_WAIT_S = 10.0  # how long a rank waits for the other local ranks' records (seconds)
_POLL_S = 0.02
_JOB_VARS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankRecord:
    """One local rank as it recorded itself: its pid, the pid's start time (psutil's
    ``create_time``, seconds since the epoch) and its CPU affinity."""

    local_rank: int
    count: int
    pid: int
    started: float
    cpus: tuple[int, ...]

    def alive(self) -> bool:
        """Whether the recorded process still runs (the same process, not a reused pid)."""
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < 0.05
        except psutil.Error:
            return False


def job_key(environ: Mapping[str, str] | None = None) -> str:
    """The job's name in record files: a short hash of the launcher's job variables."""
    env = os.environ if environ is None else environ
    parts = [env.get(name, "") for name in _JOB_VARS]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:12] if any(parts) else "default"


def _own_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()


class HostRanks:
    """The records of this job's local ranks in ``directory`` (default under the temp folder)."""

    def __init__(self, local: LocalRanks, directory: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.local = local
        self.directory = directory or os.path.join(
            tempfile.gettempdir(), f"gpufeed-{os.getuid() if hasattr(os, 'getuid') else 0}", "ranks")
        self.job = job_key(environ)

    def publish(self) -> RankRecord:
        """Write this process's record (atomically) and remove records of ended processes."""
        me = psutil.Process()
        record = RankRecord(self.local.rank, self.local.count, me.pid, me.create_time(), _own_cpus())
        os.makedirs(self.directory, mode=0o700, exist_ok=True)  # this user's records alone
        path = os.path.join(self.directory, f"{self.job}-{record.local_rank}.json")
        tmp = f"{path}.{record.pid}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"local_rank": record.local_rank, "count": record.count, "pid": record.pid,
                       "started": record.started, "cpus": list(record.cpus)}, f)
        os.replace(tmp, path)
        self._prune()
        return record

    def records(self) -> dict[int, RankRecord]:
        """The live records of this job: local rank -> record."""
        out: dict[int, RankRecord] = {}
        for _, record in self._read(self.job):
            if record.alive():
                out[record.local_rank] = record
        return out

    def wait(self, timeout_s: float) -> dict[int, RankRecord]:
        """:meth:`records` once every local rank has one, or what there is after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.records()
            if len(found) >= self.local.count or time.monotonic() >= deadline:
                return found
            time.sleep(_POLL_S)

    def _read(self, job: str | None) -> list[tuple[str, RankRecord]]:
        """(file name, record) of every readable record of ``job`` (None: of any job)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        out = []
        for name in names:
            if not name.endswith(".json") or (job is not None and not name.startswith(f"{job}-")):
                continue
            try:
                with open(os.path.join(self.directory, name), encoding="utf-8") as f:
                    d = json.load(f)
                out.append((name, RankRecord(int(d["local_rank"]), int(d["count"]), int(d["pid"]),
                                             float(d["started"]), tuple(int(c) for c in d["cpus"]))))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours: not a record
        return out

    def _prune(self) -> None:
        """Remove the records of processes that ended (any job's)."""
        for name, record in self._read(None):
            if not record.alive():
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, name))


@dataclass(frozen=True)
class Placement:
    """Where a pinned loader's workers go: ``cpus`` (worker k on ``cpus[k % len]``), ``how``
    that was decided (a sentence to say once), and whether it is a ``guess`` worth a warning
    (``LOCAL_RANK`` set but nothing says how many ranks; ranks that never recorded)."""

    cpus: tuple[int, ...]
    how: str
    guess: bool = False


def pin_share(local: LocalRanks | None, wait_s: float = RANKS_WAIT_S,
              directory: str | None = None, environ: Mapping[str, str] | None = None) -> Placement:
    """Where this rank's pinned workers go.

    Without local ranks: this process's CPUs, as if it were alone on the host. Otherwise the
    rank's :func:`cpu_share` of every local rank's recorded CPUs; ranks without a record after
    ``wait_s`` are taken to share this rank's CPUs.
    """
    own = _own_cpus()
    env = os.environ if environ is None else environ
    if local is None:
        return Placement(own, "pin_workers: no local rank known (LOCAL_RANK/LOCAL_WORLD_SIZE unset, no "
                              f"process group, no local_ranks=): workers are pinned over this process's "
                              f"{len(own)} CPUs as if it were alone on the host; with several ranks on "
                              "this host, pass local_ranks=(local rank, number of local ranks)",
                         guess="LOCAL_RANK" in env)
    if local.count == 1:
        return Placement(own, f"pin_workers: the only local rank ({local.source}): workers over "
                              f"{len(own)} CPUs")
    host = HostRanks(local, directory, env)
    host.publish()
    records = host.wait(wait_s)
    cpus_of = {rank: record.cpus for rank, record in records.items()}
    missing = [r for r in range(local.count) if r not in cpus_of]
    for r in missing:
        cpus_of[r] = own
    cpus_of[local.rank] = own
    share = cpu_share(cpus_of, local.rank) or own
    how = (f"pin_workers: local rank {local.rank} of {local.count} ({local.source}): workers on "
           f"CPUs {_ranges(share)} of this rank's {len(own)}")
    if missing:
        how += (f"; local ranks {missing} recorded no CPUs within {wait_s:g} s and are taken to "
                "share this rank's")
    return Placement(share, how, guess=bool(missing))


def _ranges(cpus: tuple[int, ...]) -> str:
    """``0-3,8,10-11`` for (0, 1, 2, 3, 8, 10, 11)."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def mark_worker(worker_id: int) -> None:
    """Name this process ``gpufeed-w<worker_id>`` in ``/proc/self/comm`` (Linux; elsewhere
    nothing): what ``ps``/``top`` show, and how :func:`workers_of` counts workers."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w", encoding="ascii") as f:
            f.write(f"{WORKER_COMM_PREFIX}{worker_id}"[:15])


def workers_of(pid: int) -> int:
    """How many gpufeed workers run under ``pid`` (its descendants named by :func:`mark_worker`)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0
    count = 0
    for child in children:
        try:
            count += child.name().startswith(WORKER_COMM_PREFIX) and child.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            continue
    return count
