"""The options of a :class:`~gpufeed.serve.DynamicBatcher`, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufeed.errors import check_int, is_int, shorten

__all__ = ["BatcherConfig"]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class BatcherConfig:
    """How a batcher forms and runs batches.

    Attributes:
        max_batch_size: most requests in one call of the model function.
        max_delay_ms: longest time the oldest queued request waits for a fuller batch
            (milliseconds, counted from that request's arrival); 0 dispatches at once.
        max_queue: most requests waiting; one more is rejected with ``Overloaded``.
        max_latency_ms: latency budget of admission (milliseconds): a request whose predicted
            time to its answer (the queue ahead of it and its own batch, at the batch run
            times measured so far) exceeds it is rejected at once with ``Overloaded``, so the
            requests accepted under overload keep to it. None: only ``max_queue`` bounds the
            queue. Until the first batch ends nothing is predicted.
        max_concurrent_batches: batches running at once (model instances), each in its thread.
        preferred_batch_sizes: sizes the model prefers (e.g. compiled for); a batch is padded
            up to the smallest one that holds it by repeating its last input, and the padding's
            results are dropped. Each must be <= ``max_batch_size``.
        default_timeout_s: deadline of requests submitted without ``timeout_s`` (None: none).
        close_timeout_s: how long ``close()`` waits by default (seconds).
        name: the batcher's name in messages, thread names and the ``batcher`` metrics label.
    """

    max_batch_size: int
    max_delay_ms: float
    max_queue: int
    max_concurrent_batches: int = 1
    max_latency_ms: float | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    default_timeout_s: float | None = None
    close_timeout_s: float = 30.0
    name: str = "batcher"

    def __post_init__(self) -> None:
        for key in ("max_batch_size", "max_queue", "max_concurrent_batches"):
            value = getattr(self, key)
            check_int(key, value, 1)
        if not _is_number(self.max_delay_ms) or self.max_delay_ms < 0:
            raise ValueError(
                f"`max_delay_ms` must be a finite number >= 0 (milliseconds). Found: {shorten(self.max_delay_ms)}."
            )
        if self.max_latency_ms is not None and (not _is_number(self.max_latency_ms) or self.max_latency_ms <= 0):
            raise ValueError(
                f"`max_latency_ms` must be a finite number > 0 (milliseconds) or None. "
                f"Found: {shorten(self.max_latency_ms)}."
            )
        sizes = self.preferred_batch_sizes
        if not isinstance(sizes, tuple) or not all(is_int(s) and 1 <= s <= self.max_batch_size for s in sizes):
            raise ValueError(
                "`preferred_batch_sizes` must be a tuple of ints in 1..max_batch_size "
                f"({self.max_batch_size}). Found: {shorten(sizes)}."
            )
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(set(sizes))))
        if self.default_timeout_s is not None and (
            not _is_number(self.default_timeout_s) or self.default_timeout_s <= 0
        ):
            raise ValueError(
                f"`default_timeout_s` must be a number > 0 (seconds) or None. Found: {shorten(self.default_timeout_s)}."
            )
        if not _is_number(self.close_timeout_s) or self.close_timeout_s < 0:
            found = shorten(self.close_timeout_s)
            raise ValueError(f"`close_timeout_s` must be a number >= 0 (seconds). Found: {found}.")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`name` must be a non-empty string. Found: {shorten(self.name)}.")

    def padded_size(self, n: int) -> int:
        """The size a batch of ``n`` requests is padded to: the smallest preferred size >= n, else n."""
        return next((s for s in self.preferred_batch_sizes if s >= n), n)
