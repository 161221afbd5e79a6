"""ReadAhead across tasks: one order, one concurrency and one budget for a worker's open tasks."""

from __future__ import annotations

import threading

import pytest

from gpufeed._engine.threads import shutdown_pools
from gpufeed.image._reads import ReadAhead

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


def test_room_left_over_begins_the_tasks_that_arrive_while_one_is_read():
    """``more`` (the worker taking tasks from its pipe) is asked once every read of the open
    tasks is submitted and the concurrency has room; the tasks it begins read at once."""
    src = GatedReads()
    src.release()
    ahead = ReadAhead(concurrency=8, budget_bytes=1 << 20)
    arriving = [[10, 11, 12]]
    begun = []
    asked_with_unsubmitted = []

    def more() -> None:
        asked_with_unsubmitted.append(any(b.unsubmitted for b in ahead.open))
        while arriving:
            begun.append(ahead.batch(src.read, arriving.pop(0)))

    ahead.more = more
    a = ahead.batch(src.read, [0, 1, 2])
    assert begun == []  # no size known yet: one read, no room to ask
    assert a.next()[1] == 0
    assert len(begun) == 1 and ahead.pending == 5  # a's last two and the new task's three
    assert [a.next()[1] for _ in range(2)] == [1, 2]
    a.close()
    assert [begun[0].next()[1] for _ in range(3)] == [10, 11, 12]
    begun[0].close()
    assert asked_with_unsubmitted and not any(asked_with_unsubmitted)
    assert src.started == [0, 1, 2, 10, 11, 12]


def test_no_asking_while_the_open_tasks_fill_the_concurrency():
    src = GatedReads()
    src.release()
    ahead = ReadAhead(concurrency=2, budget_bytes=1 << 20)
    ahead.previous_max = SIZE  # sizes known from an earlier task
    asked_at = []
    a = ahead.batch(src.read, list(range(6)))
    ahead.more = lambda: asked_at.append(a._submitted)
    got = [a.next()[1] for _ in range(6)]
    a.close()
    assert got == list(range(6))
    assert asked_at and min(asked_at) >= 6  # only once all six were submitted


class ArrivesWhileWaiting:
    """Read 0 finishes only once read 10 has started (or after 10 s, recorded): read 10 belongs
    to a task that "arrives" (``more`` returns it) on the third time the worker looks."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.timed_out = False
        self._opened = threading.Event()
        self.looks = 0

    def read(self, i: int) -> tuple[bytes, int]:
        self.started.append(i)
        if i == 10:
            self._opened.set()
        if i == 0 and not self._opened.wait(10):
            self.timed_out = True
        return bytes(SIZE), i


def test_a_task_arriving_during_a_wait_for_a_read_begins_before_that_read_ends():
    src = ArrivesWhileWaiting()
    ahead = ReadAhead(concurrency=8, budget_bytes=1 << 20)
    ahead.previous_max = SIZE
    begun = []

    def more() -> None:
        src.looks += 1
        if src.looks == 3:
            begun.append(ahead.batch(src.read, [10, 11]))

    ahead.more = more
    a = ahead.batch(src.read, [0, 1])
    assert a.next()[1] == 0
    assert not src.timed_out and src.looks >= 3  # kept looking while read 0 was out
    assert a.next()[1] == 1
    a.close()
    assert [begun[0].next()[1] for _ in range(2)] == [10, 11]
    begun[0].close()
    assert ahead.pending == 0 and ahead.open == []


class FailsAt:
    """``read(i)`` raises for ``bad``; reads of ``slow`` take 0.2 s; records which reads ended."""

    def __init__(self, bad: int, slow: tuple[int, ...] = ()) -> None:
        self.bad, self.slow = bad, set(slow)
        self.ended: list[int] = []

    def read(self, i: int) -> tuple[bytes, int]:
        if i in self.slow:
            threading.Event().wait(0.2)
        if i == self.bad:
            raise OSError(f"cannot read sample {i}")
        self.ended.append(i)
        return bytes(SIZE), i


def test_a_read_error_is_raised_at_its_turn_and_close_waits_out_started_reads():
    src = FailsAt(bad=2, slow=(3,))
    ahead = ReadAhead(concurrency=8, budget_bytes=1 << 20)
    ahead.previous_max = SIZE  # sizes known: every read starts at once
    a = ahead.batch(src.read, list(range(40)))
    assert [a.next()[1] for _ in range(2)] == [0, 1]
    with pytest.raises(OSError, match="cannot read sample 2"):
        a.next()
    a.close()
    assert 3 in src.ended  # started before the close: waited out, not left running
    ended = list(src.ended)
    threading.Event().wait(0.3)
    assert src.ended == ended  # nothing of the closed task ran after close()
    assert len(ended) < 40 - 1  # queued reads were cancelled
    assert ahead.pending == 0 and ahead.open == []
    b = ahead.batch(src.read, [50, 51])  # the read-ahead goes on with the next task
    assert [b.next()[1] for _ in range(2)] == [50, 51]
    b.close()


def test_stopping_ends_the_read_threads():
    src = GatedReads()
    src.release()
    ahead = ReadAhead(concurrency=4, budget_bytes=1 << 20)
    a = ahead.batch(src.read, [0, 1, 2])
    assert a.next()[1] == 0
    assert [t for t in threading.enumerate() if t.name.startswith("gpufeed-read")]
    ahead.stop()  # closes the open task (its reads are waited out) and ends the threads
    assert ahead.open == [] and ahead.pending == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("gpufeed-read")]


def test_a_read_ahead_inherited_through_fork_starts_its_own_threads():
    import os

    src = GatedReads()
    src.release()
    ahead = ReadAhead(concurrency=4, budget_bytes=1 << 20)
    a = ahead.batch(src.read, [0, 1])
    assert [a.next()[1] for _ in range(2)] == [0, 1]
    left_open = ahead.batch(src.read, [2, 3])  # open at fork: the child has none of its threads
    pid = os.fork()
    if pid == 0:  # the child: a fresh start, exit status 0 if the reads come back in order
        ok = False
        try:
            b = ahead.batch(src.read, [5, 6, 7])
            ok = [b.next()[1] for _ in range(3)] == [5, 6, 7] and ahead.open == [b]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [left_open.next()[1] for _ in range(2)] == [2, 3]  # the parent's reads are untouched
    a.close()
    left_open.close()


def test_after_the_threads_were_stopped_the_next_task_starts_new_ones():
    src = GatedReads()
    src.release()
    ahead = ReadAhead(concurrency=4, budget_bytes=1 << 20)
    a = ahead.batch(src.read, [0, 1, 2])
    assert a.next()[1] == 0
    a.close()
    shutdown_pools()  # as a worker on its way out (or a test's clean-up)
    assert not [t for t in threading.enumerate() if t.name.startswith("gpufeed-read")]
    b = ahead.batch(src.read, [3, 4, 5, 6, 7])
    assert [b.next()[1] for _ in range(5)] == [3, 4, 5, 6, 7]
    b.close()
