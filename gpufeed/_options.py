"""FastLoader's own options (the keyword-only ones after DataLoader's): their checks at
construction, and the metrics endpoint ``metrics_port`` starts."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from gpufeed._engine.ranks import check_local_ranks
from gpufeed.cache import CacheSize, parse_cache_bytes
from gpufeed.cache._job import SCOPES
from gpufeed.cuda._feed import check_device
from gpufeed.errors import GpufeedWarning, check_int, shorten
from gpufeed.metrics import start_server


def check_options(*, cache_bytes: CacheSize, cache_scope: str, prefetch_batches: int, metrics_port: int | None,
                  device: str | torch.device | None, local_ranks: tuple[int, int] | None) -> None:
    """``ValueError`` (or ``TypeError``) for an option a loader cannot take; nothing is started
    (no CUDA call: ``"cuda"`` is resolved at the first iteration)."""
    parse_cache_bytes(cache_bytes)
    if cache_scope not in SCOPES:
        raise ValueError(f"`cache_scope` must be one of {', '.join(map(repr, SCOPES))}. "
                         f"Found: {shorten(cache_scope)}.")
    check_int("prefetch_batches", prefetch_batches, 1)
    if metrics_port is not None:
        check_int("metrics_port", metrics_port, 0, 65535, rule="in 0-65535 (0: any free port)")
    check_device(device)
    check_local_ranks(local_ranks)


def serve_metrics(metrics_port: int) -> Any:
    """The metrics endpoint of a loader: port ``metrics_port + LOCAL_RANK`` (the ``LOCAL_RANK``
    environment variable torchrun and Lightning set; 0 when unset), so the ranks of one host
    serve side by side. ``metrics_port=0`` picks a free port. A port another program holds is
    logged as a warning, never an error: metrics must not stop a training rank."""
    port = metrics_port
    if port:
        try:
            port += int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            pass
    try:
        return start_server(min(port, 65535))
    except OSError as exc:
        warnings.warn(
            f"gpufeed metrics: port {port} (metrics_port={metrics_port} + LOCAL_RANK) cannot be bound "
            f"({exc}); this loader serves no metrics. Pick a free metrics_port, or serve them yourself "
            "(gpufeed.metrics.start_server(port).register(loader)).",
            GpufeedWarning,
            stacklevel=3,
        )
        return None
