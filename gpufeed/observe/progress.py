"""A progress bar over measurement steps (``gpufeed tune``): tqdm on stderr, or nothing."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ProgressBar"]


class ProgressBar:
    """A tqdm bar of ``total`` steps (stderr, hidden when not a terminal); every method is a
    no-op when ``enabled`` is False or tqdm is not installed."""

    def __init__(self, total: int, enabled: bool, desc: str = "gpufeed tune") -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="step", desc=desc, leave=False,
                             file=sys.stderr, disable=None)

    def start(self, label: str) -> None:
        """Show what the current step measures."""
        if self._bar is not None:
            self._bar.set_postfix_str(label)

    def done(self) -> None:
        """One step finished."""
        if self._bar is not None:
            self._bar.update(1)

    def grow(self, steps: int) -> None:
        """``steps`` more steps than planned."""
        if self._bar is not None:
            self._bar.total += steps
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
