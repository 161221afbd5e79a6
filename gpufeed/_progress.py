"""A progress bar for long commands (``gpufeed pack``, ``bench``, ``tune``, ``doctor``).

Drawn on stderr only when stderr is a terminal: never into a pipe or a log file. tqdm draws it
when installed (``pip install gpufeed[progress]``), else a one-line text bar rewritten in place
at most every 0.2 s. Every method is a no-op when the bar is not drawn.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["ProgressBar", "is_terminal"]

_REDRAW_S = 0.2  # the text bar's refresh interval


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (False for pipes, files, closed streams)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


class ProgressBar:
    """A bar of ``total`` steps of ``unit`` (``initial`` already done), labelled ``desc``, on
    ``stream`` (default ``sys.stderr``) when ``enabled`` and that stream is a terminal."""

    def __init__(self, total: int, enabled: bool, desc: str = "gpufeed tune", *,
                 unit: str = "step", initial: int = 0, stream: TextIO | None = None) -> None:
        self._bar: Any = None
        self._text: _TextBar | None = None
        stream = sys.stderr if stream is None else stream
        if not enabled or not is_terminal(stream):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._text = _TextBar(total, desc, unit, initial, stream)
            return
        self._bar = tqdm(total=total, initial=initial, unit=unit, desc=desc, leave=False,
                         file=stream)

    @property
    def drawn(self) -> bool:
        """Whether a bar is being drawn."""
        return self._bar is not None or self._text is not None

    def start(self, label: str) -> None:
        """Show what the current step does."""
        if self._bar is not None:
            self._bar.set_postfix_str(label)
        elif self._text is not None:
            self._text.label = label
            self._text.draw(force=True)

    def done(self, steps: int = 1) -> None:
        """``steps`` steps finished."""
        if self._bar is not None:
            self._bar.update(steps)
        elif self._text is not None:
            self._text.done += steps
            self._text.draw()

    def grow(self, steps: int) -> None:
        """``steps`` more steps than planned."""
        if self._bar is not None:
            self._bar.total += steps
            self._bar.refresh()
        elif self._text is not None:
            self._text.total += steps

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._text is not None:
            self._text.clear()
            self._text = None


class _TextBar:
    """``desc: done/total unit [#####.....] label``, redrawn with a carriage return."""

    def __init__(self, total: int, desc: str, unit: str, done: int, stream: TextIO) -> None:
        self.total, self.desc, self.unit, self.done, self.stream = total, desc, unit, done, stream
        self.label = ""
        self.start_s = time.perf_counter()
        self.last_s = 0.0
        self.width = 0
        self.broken = False

    def draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.broken or not force and now - self.last_s < _REDRAW_S and self.done < self.total:
            return
        self.last_s = now
        share = min(1.0, self.done / self.total) if self.total > 0 else 0.0
        filled = int(share * 20)
        rate = self.done / max(now - self.start_s, 1e-9)
        text = (f"{self.desc}: {self.done}/{self.total} {self.unit} [{'#' * filled}"
                f"{'.' * (20 - filled)}] {rate:.1f} {self.unit}/s {self.label}").rstrip()
        pad = max(0, self.width - len(text))
        self.width = len(text)
        self._write("\r" + text + " " * pad)

    def clear(self) -> None:
        self._write("\r" + " " * self.width + "\r")

    def _write(self, text: str) -> None:
        if self.broken:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing, never fail the work
            self.broken = True
