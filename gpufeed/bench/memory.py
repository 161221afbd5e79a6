"""Memory of a process tree, measured as PSS (re-exported from ``gpufeed.observe.memory``,
where the loader's tuning also reads it)."""

from gpufeed.observe.memory import (
    SAMPLER_THREAD_NAME,
    PeakPSS,
    TreeMemory,
    format_bytes,
    process_pss_bytes,
    system_shmem_bytes,
    tree_memory,
    tree_pss_bytes,
)

__all__ = [
    "SAMPLER_THREAD_NAME",
    "PeakPSS",
    "TreeMemory",
    "format_bytes",
    "process_pss_bytes",
    "system_shmem_bytes",
    "tree_memory",
    "tree_pss_bytes",
]
