"""How many samples a worker reads ahead of its decoding, for every gpufeed source (the image
sources and the detection sources): the options and their check."""

from __future__ import annotations

from gpufeed.errors import check_int

__all__ = ["DEFAULT_READ_BUDGET_BYTES", "ReadOptions"]

DEFAULT_READ_BUDGET_BYTES = 64 << 20


class ReadOptions:
    """``read_concurrency``: reads in flight per worker (1: one at a time); ``read_auto``: start
    at 1 and read ahead once reads take at least half as long as decoding; ``read_budget_bytes``:
    the bytes a worker has read (or is reading) and not yet decoded. Set by the constructors
    through :meth:`set_read_options`; a source that reads ahead needs a thread-safe
    ``read_item``."""

    read_concurrency: int = 1
    read_auto: bool = False
    read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES

    def set_read_options(self, read_concurrency: int | None, read_budget_bytes: int) -> None:
        """Check and set :attr:`read_concurrency` and :attr:`read_budget_bytes`; a
        ``read_concurrency`` of None sets :attr:`read_auto` (reads ahead once reads stall)."""
        for name, value in (("read_concurrency", read_concurrency),
                            ("read_budget_bytes", read_budget_bytes)):
            if name == "read_concurrency" and value is None:
                continue
            check_int(name, value, 1)
        self.read_auto = read_concurrency is None
        self.read_concurrency = 1 if read_concurrency is None else read_concurrency
        self.read_budget_bytes = read_budget_bytes
