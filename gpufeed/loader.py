"""FastLoader: torch's DataLoader, same signature and semantics, on gpufeed's worker engine."""

from __future__ import annotations

import inspect
import weakref
from typing import Any, TypeVar

from torch.utils.data import DataLoader, Dataset

from gpufeed._arena import Arena
from gpufeed.config import EngineConfig
from gpufeed.stats import Stats

T_co = TypeVar("T_co", covariant=True)


class FastLoader(DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader``.

    Takes exactly the installed DataLoader's arguments (same defaults, same validation, same
    ``len()``), followed by gpufeed's keyword-only options. ``num_workers=0`` is torch's own
    single-process path. With workers, batches come from gpufeed's engine: worker processes write
    tensor payloads into one shared memfd arena owned by the loader, and the batches you receive
    are views of it, valid for as long as you hold them.

    gpufeed options (keyword-only):
        max_worker_restarts: dead workers replaced per iterator before raising ``WorkerError``.
        max_batch_bytes: arena slot capacity in bytes (virtual; larger batches still work).
        shutdown_timeout_s: wait for workers to exit before terminating them, in seconds.
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        *args: Any,
        max_worker_restarts: int = EngineConfig.max_worker_restarts,
        max_batch_bytes: int = EngineConfig.max_batch_bytes,
        shutdown_timeout_s: float = EngineConfig.shutdown_timeout_s,
        **kwargs: Any,
    ) -> None:
        # gpufeed's options are validated first: nothing is started before every check passed.
        config = EngineConfig(
            max_worker_restarts=max_worker_restarts,
            max_batch_bytes=max_batch_bytes,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        super().__init__(dataset, *args, **kwargs)
        self.engine_config = config
        self._stats = Stats()
        self._arena: Arena | None = None
        self._arena_finalizer: weakref.finalize | None = None

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        from gpufeed._iterator import FastIter

        self.check_worker_number_rationality()
        return FastIter(self)

    def _get_arena(self) -> Arena:
        """The loader's arena, created on first use and reused by every later iterator."""
        if self._arena is None:
            self._arena = Arena(self.engine_config.max_batch_bytes)
            self._arena_finalizer = weakref.finalize(self, self._arena.close)
        return self._arena

    def stats(self) -> dict[str, float | int]:
        """Counters since the loader was created: batches, stage seconds, data wait, restarts."""
        return self._stats.snapshot()

    def close(self) -> None:
        """Stop persistent workers and release the arena now (idempotent).

        Batches you still hold stay valid; the loader can be iterated again afterwards.
        """
        iterator = self._iterator
        if iterator is not None and hasattr(iterator, "close"):
            iterator.close()
        self._iterator = None
        if self._arena_finalizer is not None:
            self._arena_finalizer()
        self._arena = None
        self._arena_finalizer = None

    def __enter__(self) -> FastLoader[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _signature() -> inspect.Signature:
    """The installed DataLoader's signature followed by gpufeed's keyword-only options."""
    torch_params = list(inspect.signature(DataLoader.__init__).parameters.values())
    ours = [
        p
        for name, p in inspect.signature(FastLoader.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return inspect.Signature(torch_params + ours)


FastLoader.__init__.__signature__ = _signature()  # type: ignore[attr-defined]
