"""The batcher's own errors (both :class:`gpufeed.errors.GpufeedError`).

Errors raised by the model function keep their type; expired requests fail with the built-in
``TimeoutError``; requests left when a batcher closes are cancelled.
"""

from __future__ import annotations

from gpufeed.errors import GpufeedError

__all__ = ["BatcherClosedError", "Overloaded"]


class Overloaded(GpufeedError):
    """The batcher's queue holds ``max_queue`` requests: the new one is rejected at once.

    Backpressure: answer it as HTTP 503 / gRPC RESOURCE_EXHAUSTED and let the client retry.
    """


class BatcherClosedError(GpufeedError):
    """A request was submitted to a batcher after ``close()``."""
