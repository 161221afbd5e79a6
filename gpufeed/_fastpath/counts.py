"""What both fast-path feeds count of the batches they hand out: images kept, samples skipped
(``on_error="skip"``), and a warning per skipped file, once."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class SkipCounts:
    """``images`` and ``skipped`` so far; :meth:`count` takes one filled batch's report (its
    ``kept`` positions and ``errors`` as (index, file, message))."""

    def __init__(self) -> None:
        self.images = 0
        self.skipped = 0
        self._logged: set[str] = set()

    def count(self, report: Any) -> None:
        """Count the batch; log each skipped file once."""
        self.images += len(report.kept)
        self.skipped += len(report.errors)
        for index, where, message in report.errors:
            if where not in self._logged:
                self._logged.add(where)
                log.warning("gpufeed: skipped %s (sample index %d): %s", where, index, message)
