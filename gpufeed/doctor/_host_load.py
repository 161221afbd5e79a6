"""The other local ranks of a job and their workers, for ``gpufeed.doctor``: read from their
records and ``/proc`` (docs/design/local-ranks.md, "Counting the host's workers")."""

from __future__ import annotations

import os
from typing import Any

from gpufeed._engine.host import HostRanks, workers_of
from gpufeed._engine.ranks import find_local_ranks


class HostLoad:
    """The local ranks sharing this host with ``loader``'s process and the most gpufeed workers
    the other ranks were seen running (each :meth:`read` looks again). Without several local
    ranks (nothing says so), one rank and no other workers."""

    def __init__(self, loader: Any) -> None:
        local = find_local_ranks(getattr(loader, "local_ranks", None))
        self._host = HostRanks(local) if local is not None and local.count > 1 else None
        self.ranks = 1 if local is None else local.count
        self.other_workers = 0

    def read(self) -> None:
        """Count the other ranks' live workers now; keep the largest count seen."""
        if self._host is None:
            return
        records = self._host.records()
        others = [r.pid for r in records.values() if r.pid != os.getpid()]
        self.ranks = max(self.ranks, len(records))
        self.other_workers = max(self.other_workers, sum(workers_of(pid) for pid in others))
