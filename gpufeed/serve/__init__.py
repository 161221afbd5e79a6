"""Dynamic batching for inference: many single requests in, one model call per batch.

::

    from gpufeed.serve import DynamicBatcher

    with DynamicBatcher(model_fn, max_batch_size=32, max_delay_ms=5, max_queue=1024) as batcher:
        future = batcher.submit(x)              # any thread: a concurrent.futures.Future
        y = await batcher.infer(x)              # asyncio

A batch is dispatched as soon as a model slot is free and either the batch is full or its
oldest request has waited ``max_delay_ms``. Importing this package starts nothing; a
``DynamicBatcher`` owns one scheduler thread and ``max_concurrent_batches`` model threads.
``ImageBatcher`` serves an image model from encoded bytes, decoded in gpufeed's worker processes.
"""

from gpufeed.serve._batcher import DynamicBatcher
from gpufeed.serve._clock import Clock, ManualClock, MonotonicClock
from gpufeed.serve._config import BatcherConfig
from gpufeed.serve._errors import BatcherClosedError, Overloaded
from gpufeed.serve._images import ImageBatcher
from gpufeed.serve._stats import BatcherCollector, Histogram

__all__ = [
    "BatcherClosedError",
    "BatcherCollector",
    "BatcherConfig",
    "Clock",
    "DynamicBatcher",
    "Histogram",
    "ImageBatcher",
    "ManualClock",
    "MonotonicClock",
    "Overloaded",
]
