"""gpufeed's own loader options, as data: frozen dataclasses validated on construction.

``FastLoader`` takes these options as keyword arguments, as DataLoader takes its own, and holds
them as an :class:`EngineConfig` (``loader.engine_config``); the engine reads them from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.errors import check_int, shorten


def _check_seconds(name: str, value: object, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number of seconds. Found: {shorten(value)}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum} s. Found: {value}.")


@dataclass(frozen=True)
class EngineConfig:
    """Options of the multi-process engine (used when ``num_workers > 0``).

    Attributes:
        max_worker_restarts: dead workers replaced per iterator before giving up with an error.
        max_batch_bytes: capacity of one arena slot in bytes (virtual: pages are only used when
            written). A batch larger than this still works, its excess is pickled instead.
        shutdown_timeout_s: how long shutdown waits for workers to exit before terminating them.
        liveness_interval_s: longest time a blocking wait goes without checking worker liveness.
    """

    max_worker_restarts: int = 3
    max_batch_bytes: int = 1 << 30
    shutdown_timeout_s: float = 2.0
    liveness_interval_s: float = 0.25

    def __post_init__(self) -> None:
        check_int("max_worker_restarts", self.max_worker_restarts, 0, typed=True)
        check_int("max_batch_bytes", self.max_batch_bytes, 1 << 16, typed=True)
        _check_seconds("shutdown_timeout_s", self.shutdown_timeout_s, 0.0)
        _check_seconds("liveness_interval_s", self.liveness_interval_s, 0.001)
