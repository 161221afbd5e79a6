"""Benchmark harness: compare loaders in one run (ratios, not lone timings), PSS of a process
tree, and the environment every result records. Importing it starts nothing."""

from gpufeed.bench.compare import CompareResult, LoaderSummary, RoundResult, compare
from gpufeed.bench.datasets import SyntheticImageDataset
from gpufeed.bench.environment import describe_environment
from gpufeed.observe.memory import PeakPSS, format_bytes, tree_pss_bytes

__all__ = [
    "CompareResult",
    "LoaderSummary",
    "PeakPSS",
    "RoundResult",
    "SyntheticImageDataset",
    "compare",
    "describe_environment",
    "format_bytes",
    "tree_pss_bytes",
]
