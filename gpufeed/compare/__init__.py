"""Loaders side by side: ``compare`` runs several loaders over the same data in one run,
alternating, and reports images/s, their ratios and peak PSS (never a lone timing); the PSS of a
process tree; the environment every result records. ``gpufeed bench`` is built on it. Importing
it starts nothing."""

from gpufeed._observe.memory import (
    SAMPLER_THREAD_NAME,
    PeakPSS,
    TreeMemory,
    format_bytes,
    process_pss_bytes,
    system_shmem_bytes,
    tree_memory,
    tree_pss_bytes,
)
from gpufeed.compare._compare import CompareResult, LoaderSummary, RoundResult, compare
from gpufeed.compare._datasets import SyntheticImageDataset
from gpufeed.compare._environment import describe_environment

__all__ = [
    "CompareResult",
    "LoaderSummary",
    "PeakPSS",
    "RoundResult",
    "SAMPLER_THREAD_NAME",
    "SyntheticImageDataset",
    "TreeMemory",
    "compare",
    "describe_environment",
    "format_bytes",
    "process_pss_bytes",
    "system_shmem_bytes",
    "tree_memory",
    "tree_pss_bytes",
]
