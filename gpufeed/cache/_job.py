"""Which job a process belongs to, for the host cache: the only place its environment is read.

The rules (first found) are in docs/design/host-cache.md, "Which loaders share".
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JOB_ENV = "GPUFEED_CACHE_JOB"
SCOPES = ("auto", "host", "rank")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The job key (None: not found), how it was found, and the local ranks known."""

    key: str | None
    source: str
    local_world_size: int | None
    world_size: int | None
    local_rank: int


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def store_key(store: Any, hostname: str) -> str:
    """A key agreed by every rank of the host through a torch.distributed store: the first
    to ask sets a random one, the others read it (``compare_set`` never blocks)."""
    value = store.compare_set(f"gpufeed/host-cache/{hostname}", "", uuid.uuid4().hex)
    return value.decode() if isinstance(value, bytes) else str(value)


def _process_group_key() -> tuple[str | None, int | None]:
    """(key from the default store, world size) when torch.distributed is initialised with
    more than one rank, else (None, None)."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None, None
        world = dist.get_world_size()
        if world <= 1:
            return None, world
        from torch.distributed.distributed_c10d import _get_default_store

        return "store:" + store_key(_get_default_store(), socket.gethostname()), world
    except (ImportError, RuntimeError, AttributeError, ValueError):
        return None, None


def job_info(env: Mapping[str, str] | None = None) -> JobInfo:
    """This process's job key for the host cache (``env``: ``os.environ`` by default)."""
    env = os.environ if env is None else env
    local_world, world = _int(env, "LOCAL_WORLD_SIZE"), _int(env, "WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK") or 0
    explicit = env.get(JOB_ENV, "")
    if explicit:
        return JobInfo("env:" + explicit, JOB_ENV, local_world, world, local_rank)
    master = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return JobInfo(f"elastic:{run_id}:{master}", "TORCHELASTIC_RUN_ID", local_world, world, local_rank)
    if master != ":" and world is not None and world > 1:
        return JobInfo(f"master:{master}:{world}", "MASTER_ADDR:MASTER_PORT", local_world, world, local_rank)
    key, pg_world = _process_group_key()
    if key is not None:
        return JobInfo(key, "torch.distributed store", local_world, pg_world, local_rank)
    return JobInfo(None, "none", local_world, world, local_rank)


def wants_host_cache(scope: str, info: JobInfo) -> bool:
    """Whether a loader with ``cache_scope=scope`` uses the host cache (``"host"`` without a
    job key is the caller's error to raise)."""
    if scope == "rank" or not hasattr(os, "memfd_create"):
        return False
    if scope == "host":
        return True
    if info.key is None:
        return False
    if info.source == JOB_ENV:
        return True
    if info.local_world_size is not None:
        return info.local_world_size > 1
    return info.world_size is not None and info.world_size > 1


def host_metrics_exporter(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process exports the host cache's bytes and budget: local rank 0
    (``LOCAL_RANK`` unset counts as 0). docs/design/host-cache.md, "Metrics once per host"."""
    env = os.environ if env is None else env
    return (_int(env, "LOCAL_RANK") or 0) == 0
