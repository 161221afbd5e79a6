"""The warning given when Accelerate rebuilds a FastLoader as a plain torch DataLoader.

Kept apart from ``gpufeed.integrations.accelerate``, which sits above the loader, so that the
loader can give it without importing that package or accelerate.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from gpufeed.errors import GpufeedWarning

_OWN = ("accelerate", "gpufeed", "torch", "contextlib")


def warn_rebuilt_by_accelerate(loader: Any) -> None:
    """Warn, once per loader, that Accelerate is building a plain DataLoader from ``loader``."""
    if loader.__dict__.get("_warned_accelerate_rebuild", False):
        return
    loader._warned_accelerate_rebuild = True
    prepared = getattr(loader, "_is_accelerate_prepared", False)
    if prepared:  # an AcceleratedFastLoader handed to accelerate's skip_first_batches
        fix = (
            "To skip batches use `gpufeed.integrations.accelerate.skip_first_batches(loader, n)` (or, with "
            "DataLoaderConfiguration(use_stateful_dataloader=True), accelerator.load_state() resumes it)."
        )
    else:
        fix = (
            "Prepare it with `loader = gpufeed.integrations.accelerate.prepare(accelerator, loader)`: "
            "Accelerate's sharding, device placement and gather_for_metrics, batches from gpufeed."
        )
    warnings.warn(
        f"Accelerate is rebuilding this {type(loader).__name__} as a plain torch.utils.data.DataLoader "
        "from its torch arguments: the loader it returns runs none of gpufeed (no gpufeed workers or "
        "image fast path; normalize, dtype, device, cache_bytes, seed, metrics_port are ignored). " + fix,
        GpufeedWarning,
        stacklevel=_user_stacklevel(),
    )


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside accelerate, gpufeed and torch (the user's line)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OWN:
        frame = frame.f_back
        level += 1
    return level
