"""What lives as long as a loader and every engine it starts shares: the engine's context.

The loader builds one ``EngineContext``; each ``Engine`` (one per multi-process iterator, or one
per task stream) reads everything it needs from it, never from the loader. Values that change
per pass (the augmentation epoch) are passed explicitly where a pass starts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
import weakref
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import torch

from gpufeed._engine.arena import Arena
from gpufeed._engine.host import HostRanks, Placement, pin_share
from gpufeed._engine.ranks import find_local_ranks
from gpufeed.config import EngineConfig
from gpufeed.errors import GpufeedWarning
from gpufeed.stats import Stats

if TYPE_CHECKING:
    from gpufeed._engine.plugin import FillPlugin

logger = logging.getLogger(__name__)


class Registrar(Protocol):
    """Page-locks arena slots for CUDA copies (``gpufeed.cuda._feed.HostRegistrar``)."""

    def ensure(self, slot: int, nbytes: int, /) -> None:
        """Make the first ``nbytes`` of ``slot`` page-locked (once per slot extent)."""


class LiveEngine(Protocol):
    """What the context reads of the engines it lists (``engine.Engine``, which imports this
    module, so the type is named by what it offers)."""

    @property
    def pids(self) -> list[int]:
        """Pids of the engine's live worker processes."""


class EngineContext:
    """A loader's long-lived engine state.

    Attributes:
        config: the engine's options.
        stats: the loader's counters (every engine adds to them).
        plugin: the batch path plug-in (the image feed), or None for fetch + collate.
        pin_workers: pin worker k to one CPU, round-robin over this rank's share of the
            host's CPUs (:meth:`pin_cpus`).
        local_ranks: ``(local rank, local ranks)`` given to the loader, or None: found from the
            environment or the process group (``gpufeed._engine.ranks.find_local_ranks``).
        log_dir: each worker also logs to ``LOG_DIR/worker-K.log``.
        fork_guard: entered around each worker's ``Process.start()`` under fork.
        engines: the live engines (for worker pids and usage).
        registrar: page-locks arena slots for CUDA (created with the arena when wanted).
        skeletons: the packed skeletons of batches the plug-in completed, by their layout
            (``FillPlugin.complete``), reused by every engine of the loader.

    ``make_registrar(arena)`` makes the registrar (``gpufeed.cuda._feed.CudaFeed.registrar``, given
    by the loader), used only for ``cuda_output`` and when CUDA is available. Arena memory is
    page-locked only for the CUDA feed, which issues every copy from it on its own stream and so
    knows when a slot may be reused; with ``pin_memory`` alone the user copies on streams gpufeed
    cannot see, and batches are copied into torch's pinned memory instead (``FastIter``).
    """

    def __init__(
        self,
        config: EngineConfig,
        stats: Stats,
        *,
        plugin: FillPlugin | None = None,
        cuda_output: bool = False,
        pin_workers: bool = False,
        local_ranks: tuple[int, int] | None = None,
        log_dir: str | None = None,
        fork_guard: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        make_registrar: Callable[[Arena], Registrar] | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.plugin = plugin
        self.pin_workers = pin_workers
        self.local_ranks = local_ranks
        self.log_dir = log_dir
        self.fork_guard = fork_guard
        self.engines: weakref.WeakSet[LiveEngine] = weakref.WeakSet()
        self.registrar: Registrar | None = None
        self.skeletons: dict[Hashable, tuple[bytes, int, int]] = {}
        self._cuda_output = cuda_output  # batches go to the GPU through gpufeed.cuda._feed.CudaFeed
        self._make_registrar = make_registrar
        self._arena: Arena | None = None
        self._pins: tuple[int, ...] | None = None  # decided at the first engine, then kept

    @property
    def current_arena(self) -> Arena | None:
        """The arena if one was created (and not closed since), else None."""
        return self._arena

    def arena(self, warm_cap: int) -> Arena:
        """The loader's arena, created on first use and reused by every later engine.

        ``warm_cap`` (warm slot ids allowed to wait in the arena's pipe) only matters when it is
        created.
        """
        if self._arena is None:
            arena = Arena(self.config.max_batch_bytes, warm_cap=warm_cap)
            # device_count(): NVML's count, no CUDA runtime call (is_available() would make one,
            # and ImageBatcher builds its arena before its workers start)
            if self._cuda_output and self._make_registrar is not None and torch.cuda.device_count() > 0:
                self.registrar = self._make_registrar(arena)
            self._arena = arena
        return self._arena

    def pin_cpus(self) -> tuple[int, ...]:
        """The CPUs workers are pinned to, round-robin (empty: not pinned), decided when the
        first engine starts and kept: this rank's share of the CPUs it shares with the other
        local ranks (docs/design/local-ranks.md), logged once. With several local ranks, the
        rank's record is written even unpinned, so the doctor finds its workers."""
        if self._pins is None:
            self._pins = self._place()
        return self._pins

    def _place(self) -> tuple[int, ...]:
        local = find_local_ranks(self.local_ranks)
        if not self.pin_workers or not hasattr(os, "sched_getaffinity"):
            if local is not None and local.count > 1:
                try:
                    HostRanks(local).publish()
                except OSError as exc:  # a read-only temp folder: the doctor will not see this rank
                    logger.debug("gpufeed: no rank record written: %s", exc)
            return ()
        try:
            placed = pin_share(local)
        except OSError as exc:
            own = tuple(sorted(os.sched_getaffinity(0)))
            placed = Placement(own, f"pin_workers: the local ranks' records cannot be written ({exc}): "
                                    f"workers are pinned over this process's {len(own)} CPUs as if it "
                                    "were alone", guess=True)
        if placed.guess:
            warnings.warn(f"gpufeed {placed.how}.", GpufeedWarning, stacklevel=2)
        else:
            logger.info("gpufeed %s", placed.how)
        return placed.cpus

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes of every live engine."""
        return [pid for engine in list(self.engines) for pid in engine.pids]

    def close(self) -> None:
        """Release the arena (idempotent); a later engine creates a new one. Batches a user
        holds stay valid, and engines still running keep it open until they stop."""
        arena, self._arena, self.registrar = self._arena, None, None
        if arena is not None:
            arena.close()


_CGROUP = "/sys/fs/cgroup"  # the cgroup v2 root of this process (a test points it elsewhere)


def cgroup_path(name: str, cgroup_dir: str | None = None) -> str:
    """The path of the cgroup v2 file ``name`` (in ``cgroup_dir``, default ``/sys/fs/cgroup``)."""
    return os.path.join(cgroup_dir or _CGROUP, name)


def usable_cpus() -> list[int]:
    """CPU numbers this process may run on (all CPUs where affinity is unsupported)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cgroup_quota_cores(cgroup_dir: str | None = None) -> float | None:
    """The cgroup v2 CPU quota in cores (``cpu.max``; possibly fractional), or None without one."""
    try:
        with open(cgroup_path("cpu.max", cgroup_dir)) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        cores = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return cores if cores > 0 else None


def usable_cores(cgroup_dir: str | None = None) -> int:
    """Whole cores this process may keep busy, i.e. how many processes can run at once: the CPUs
    of its affinity mask, capped by the cgroup CPU quota rounded up (``min(affinity CPUs,
    ceil(quota))``, at least 1)."""
    cpus = len(usable_cpus())
    quota = cgroup_quota_cores(cgroup_dir)
    return max(1, cpus if quota is None else min(cpus, math.ceil(quota)))
