"""Which local rank this process is, how many local ranks share its host, and which CPUs its
workers may take (docs/design/local-ranks.md).

:func:`find_local_ranks` reads, in order: the loader's ``local_ranks=(rank, count)`` option;
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (torchrun, Accelerate's launcher); an initialised
``torch.distributed`` process group whose rank is the ``LOCAL_RANK`` (if set), taken as one
host. :func:`cpu_share` is the rule that divides CPUs among the ranks that share them: a pure
function of every local rank's CPU set, so every rank computes the same split.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpufeed.errors import is_int, shorten

__all__ = ["LocalRanks", "check_local_ranks", "cpu_share", "cpu_shares", "find_local_ranks", "fitting_workers"]


@dataclass(frozen=True)
class LocalRanks:
    """This process's place on its host: ``rank`` of ``count`` local ranks, learnt from
    ``source`` (``"local_ranks="``, ``"LOCAL_RANK/LOCAL_WORLD_SIZE"``, ``"process group"``)."""

    rank: int
    count: int
    source: str

    def __post_init__(self) -> None:
        check_local_ranks((self.rank, self.count))


def check_local_ranks(value: Any) -> tuple[int, int] | None:
    """``value`` as ``(local rank, local world size)``, or None; ValueError when it is not."""
    if value is None:
        return None
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        is_int(v) for v in value)
    if not ok or not 0 <= value[0] < value[1]:
        raise ValueError(
            "`local_ranks` must be None or (local rank, number of local ranks) with "
            f"0 <= local rank < number, e.g. (LOCAL_RANK, LOCAL_WORLD_SIZE). Found: {shorten(value)}.")
    return int(value[0]), int(value[1])


def _env_int(name: str, environ: Mapping[str, str]) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def find_local_ranks(option: tuple[int, int] | None = None,
                     environ: Mapping[str, str] | None = None) -> LocalRanks | None:
    """Where this process sits on its host, or None when nothing says (see the module's doc).

    A process group is taken as one host only when ``LOCAL_RANK`` is unset or equals the group's
    rank (a launcher that sets ``LOCAL_RANK`` alone, as Lightning does, on one host): on several
    hosts, give ``LOCAL_WORLD_SIZE`` or the option.
    """
    if option is not None:
        given = check_local_ranks(option) or (0, 1)
        return LocalRanks(given[0], given[1], "local_ranks=")
    env = os.environ if environ is None else environ
    rank, count = _env_int("LOCAL_RANK", env), _env_int("LOCAL_WORLD_SIZE", env)
    if rank is not None and count is not None and 0 <= rank < count:
        return LocalRanks(rank, count, "LOCAL_RANK/LOCAL_WORLD_SIZE")
    group = _process_group()
    if group is not None and (rank is None or rank == group[0]) and 0 <= group[0] < group[1]:
        return LocalRanks(group[0], group[1], "process group")
    return None


def _process_group() -> tuple[int, int] | None:
    """(rank, world size) of torch's default process group, if one is initialised. Only looked
    up when the program imported ``torch.distributed`` (no group exists otherwise): importing it
    here would cost every single-process loader the import."""
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def fitting_workers(cores: float, local_ranks: int) -> int:
    """Workers per rank so that ``local_ranks`` x (workers + 1 main process) fit in ``cores``
    (at least 1; ``cores`` itself for a single rank): the rule of ``gpufeed.tune`` and of the
    doctor's "host" verdict."""
    if local_ranks <= 1:
        return max(1, int(cores))
    return max(1, int(cores) // local_ranks - 1)


def cpu_shares(cpus_of: Mapping[int, Collection[int]]) -> dict[int, tuple[int, ...]]:
    """The CPUs each local rank's workers take, given every local rank's CPU set (``cpus_of``):
    rank -> sorted CPUs.

    Each CPU belongs to the ranks whose sets hold it; the CPUs held by the same ranks form a
    group, and groups are dealt in order of how many ranks hold them (a rank's own CPUs first).
    A group with at least as many CPUs as ranks is cut into contiguous runs, one per rank in
    local-rank order (sizes differ by at most one): ranks sharing one set (no binding, a
    container's cpuset) get disjoint slices, ranks on different NUMA nodes split only their
    node. A group with fewer CPUs than ranks gives one CPU to each of the ranks with the fewest
    CPUs so far, then CPU ``i mod n`` to each rank that still has none: every CPU holds the
    workers of as few ranks as can be.
    """
    owners: dict[int, list[int]] = {}
    for r in sorted(cpus_of):
        for cpu in cpus_of[r]:
            owners.setdefault(cpu, []).append(r)
    groups: dict[tuple[int, ...], list[int]] = {}
    for cpu in sorted(owners):
        groups.setdefault(tuple(owners[cpu]), []).append(cpu)
    shares: dict[int, list[int]] = {r: [] for r in cpus_of}
    for ranks, cpus in sorted(groups.items(), key=lambda g: (len(g[0]), g[1][0])):
        k, n = len(ranks), len(cpus)
        if k <= n:
            for i, r in enumerate(ranks):
                shares[r] += cpus[i * n // k:(i + 1) * n // k]
            continue
        order = sorted(ranks, key=lambda r: (len(shares[r]), r))
        for j, r in enumerate(order):
            if j < n or not shares[r]:
                shares[r].append(cpus[j % n])
    return {r: tuple(sorted(cpus)) for r, cpus in shares.items()}


def cpu_share(cpus_of: Mapping[int, Collection[int]], rank: int) -> tuple[int, ...]:
    """``rank``'s part of :func:`cpu_shares` (empty when ``rank`` has no CPUs)."""
    return cpu_shares(cpus_of).get(rank, ())
