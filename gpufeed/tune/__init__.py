"""Find a good ``num_workers`` (and ``read_concurrency``, ``pin_workers``, ``prefetch_factor``,
``cache_bytes``) by measuring.

The practice that works: measure a one-worker baseline, double the workers, find the *knee*
where the gain shrinks, back off one step, and stay under a memory ceiling. When reading
dominates the baseline (slow storage), first raise the reads in flight per worker (the image
dataset's ``read_concurrency``: 1, 4, 16, 64), which costs threads, not processes::

    from gpufeed.tune import tune
    result = tune(dataset=ImageFolder(root, transform=ResizeCenterCrop(224, 256)), batch_size=64)
    print(result.format_table())
    loader = FastLoader(ds, batch_size=64, num_workers=result.recommended_num_workers, ...)

:func:`measure` takes one measurement (one loader, one worker count) as a :class:`TuneRow`;
:func:`tune` runs the search and returns a :class:`TuneResult` whose ``reasons`` say why each
step was taken or the search stopped. ``gpufeed tune ROOT`` (:mod:`gpufeed.cli.tune`) is the
command line. Importing this module starts nothing.
"""

from gpufeed.tune._tune import (
    READ_CONCURRENCIES,
    TuneResult,
    TuneRow,
    cache_bytes_needed,
    measure,
    recommend_cache_bytes,
    recommend_prefetch_factor,
    search_read_concurrency,
    tree_cpu_s,
    tune,
    usable_cores,
    worker_counts,
)

__all__ = [
    "READ_CONCURRENCIES",
    "TuneResult",
    "TuneRow",
    "cache_bytes_needed",
    "measure",
    "recommend_cache_bytes",
    "recommend_prefetch_factor",
    "search_read_concurrency",
    "tree_cpu_s",
    "tune",
    "usable_cores",
    "worker_counts",
]
