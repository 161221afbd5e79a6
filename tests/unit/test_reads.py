"""ReadAhead across tasks: one order, one concurrency and one budget for a worker's open tasks."""

from __future__ import annotations

import threading

import pytest

from gpufeed._engine.threads import shutdown_pools
from gpufeed._image.reads import ReadAhead

SIZE = 100  # bytes per sample


@pytest.fixture(autouse=True)
def _no_threads_left():
    yield
    shutdown_pools()  # this process's gpufeed-read threads, as a worker does on its way out


class GatedReads:
    """``read(i)`` waits until ``release()`` lets it finish; records the order reads started."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self._lock = threading.Lock()
        self._gate = threading.Event()

    def read(self, i: int) -> tuple[bytes, int]:
        with self._lock:
            self.started.append(i)
        self._gate.wait(10)
        return bytes(SIZE), i

    def release(self) -> None:
        self._gate.set()


def test_a_later_task_reads_after_the_earlier_ones_and_shares_the_budget():
    src = GatedReads()
    ahead = ReadAhead(concurrency=8, budget_bytes=4 * SIZE)
    a = ahead.batch(src.read, [0, 1, 2])
    b = ahead.batch(src.read, [10, 11, 12, 13, 14])
    assert ahead.pending == 1  # no size known yet: one read
    src.release()
    got_a = [a.next()[1] for _ in range(3)]
    assert got_a == [0, 1, 2]
    assert ahead.pending <= 4  # the budget holds across both tasks
    assert ahead.pending > 0  # b's reads began while a was still open
    a.close()
    assert [b.next()[1] for _ in range(5)] == [10, 11, 12, 13, 14]
    b.close()
    assert src.started[:3] == [0, 1, 2]  # task order, then index order
    assert sorted(src.started) == [0, 1, 2, 10, 11, 12, 13, 14]
    assert ahead.pending == 0 and ahead.open == []


def test_closing_an_unused_task_cancels_its_reads_and_frees_the_budget():
    src = GatedReads()
    ahead = ReadAhead(concurrency=4, budget_bytes=1 << 20)
    a = ahead.batch(src.read, [0, 1])
    src.release()
    assert a.next()[1] == 0
    skipped = ahead.batch(src.read, list(range(10, 40)))  # a queued task that will not run
    skipped.close()
    skipped.close()  # idempotent
    assert a.next()[1] == 1
    a.close()
    assert ahead.pending == 0 and ahead.open == []
    c = ahead.batch(src.read, [50, 51, 52, 53])
    assert [c.next()[1] for _ in range(4)] == [50, 51, 52, 53]
    c.close()
    assert len(src.started) < 2 + 30 + 4  # some of the skipped task's reads never ran
