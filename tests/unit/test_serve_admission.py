"""Latency-aware admission (``max_latency_ms``): the prediction of ``_admission.RunTimes`` on its
own, then through a DynamicBatcher on a ManualClock (batch run times set by advancing the clock
while the model function is held)."""

from __future__ import annotations

import queue
import threading

import pytest

from gpufeed.serve import BatcherConfig, DynamicBatcher, ManualClock, Overloaded
from gpufeed.serve._admission import RECENT, RunTimes

WAIT_S = 10.0  # real-time bound on anything that should take milliseconds


# -- the prediction -------------------------------------------------------------------------------


def measured(*runs: tuple[int, float]) -> RunTimes:
    """RunTimes that saw batches of (size, seconds), one after another from t=0."""
    times = RunTimes()
    for seq, (size, took) in enumerate(runs):
        times.started(seq, 0.0, size)
        times.ended(seq, took)
    return times


def test_nothing_is_predicted_before_a_batch_ended():
    times = RunTimes()
    times.started(1, 0.0, 4)
    assert times.estimate_s(4) is None
    assert times.answer_in_s(0.5, queued=10, oldest_of_last=0.5, free_slots=0, max_batch_size=4, delay_s=0.0) is None


def test_run_times_are_the_median_of_recent_runs_per_size_and_unseen_sizes_scale_from_below():
    times = measured((4, 2.0))  # a slow first batch (workers starting) ...
    assert times.estimate_s(4) == pytest.approx(2.0)
    times = measured((4, 2.0), (4, 0.4), (4, 0.5))
    assert times.estimate_s(4) == pytest.approx(0.5)  # ... does not lock requests out for long
    times = measured(*[(4, 9.0)] * 3, *[(4, 0.4)] * RECENT)
    assert times.estimate_s(4) == pytest.approx(0.4)  # only the last RECENT runs count
    assert times.estimate_s(8) == pytest.approx(0.8)  # an unseen larger size: at most linearly more
    assert times.estimate_s(2) == pytest.approx(0.4)  # no smaller size seen: the smallest above
    times = measured((1, 0.1), (4, 0.3))
    assert times.estimate_s(2) == pytest.approx(0.2)  # from size 1, the nearest below
    assert times.estimate_s(1) == pytest.approx(0.1)


def test_queued_batches_take_the_slots_in_turn_from_when_each_frees():
    times = measured((2, 0.4))
    times.started(10, 1.0, 2)  # running since t=1.0: ends at about 1.4
    times.started(11, 1.2, 2)  # ends at about 1.6
    now = 1.3
    # the first full batch ahead takes the slot freeing at 1.4, the second the one at 1.6, the new
    # request's (third, alone) the first slot again at 1.4 + 0.4; then its own 0.4 s
    answer = times.answer_in_s(now, queued=4, oldest_of_last=now, free_slots=0, max_batch_size=2, delay_s=0.0)
    assert answer == pytest.approx(1.8 + 0.4 - now)
    # one request queued: the new one joins its batch, which goes when the first slot frees
    answer = times.answer_in_s(now, queued=1, oldest_of_last=1.25, free_slots=0, max_batch_size=2, delay_s=0.0)
    assert answer == pytest.approx(1.4 + 0.4 - now)


def test_a_batch_that_finds_a_slot_free_at_once_is_never_refused():
    times = measured((4, 60.0))  # however slow the model
    # nothing running, one idle slot: a lone request (it waits only for its own timer), one that
    # joins a forming batch, one that fills it
    assert times.answer_in_s(5.0, 0, 5.0, 1, 4, 0.05) is None
    assert times.answer_in_s(5.0, 2, 4.99, 1, 4, 0.05) is None
    assert times.answer_in_s(5.0, 3, 4.99, 1, 4, 0.05) is None
    # the next one starts a batch behind that full one: it waits for the slot, then runs
    assert times.answer_in_s(5.0, 4, 5.0, 1, 4, 0.05) == pytest.approx(60.0 + 60.0)


def test_a_partial_batch_is_predicted_at_the_size_it_is_padded_to():
    times = measured((2, 0.1), (4, 0.3))
    times.started(7, 0.0, 4)  # the only slot, free at 0.3
    pad = BatcherConfig(max_batch_size=4, max_delay_ms=0, max_queue=8, preferred_batch_sizes=(4,)).padded_size
    assert times.answer_in_s(0.0, 1, 0.0, 0, 4, 0.0) == pytest.approx(0.3 + 0.1)  # runs as 2
    assert times.answer_in_s(0.0, 1, 0.0, 0, 4, 0.0, pad) == pytest.approx(0.3 + 0.3)  # padded to 4


def test_an_overdue_running_batch_is_expected_to_end_now():
    times = measured((4, 0.2))
    times.started(3, 0.0, 4)  # expected to end at 0.2; now is 5.0
    assert times.answer_in_s(5.0, 4, 4.99, 0, 4, 0.0) == pytest.approx(0.2 + 0.2)
    assert times.answer_in_s(5.0, 3, 4.99, 0, 4, 0.0) is None  # its batch would take that slot now


# -- through the batcher ---------------------------------------------------------------------------


class Held:
    """A model function that doubles its inputs, each call held until the test releases it."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[list] = queue.SimpleQueue()
        self.release = threading.Semaphore(0)

    def __call__(self, inputs: list) -> list:
        self.calls.put(list(inputs))
        assert self.release.acquire(timeout=WAIT_S)
        return [2 * x for x in inputs]

    def started(self) -> list:
        return self.calls.get(timeout=WAIT_S)


@pytest.fixture
def batcher():
    made: list[DynamicBatcher] = []

    def make(fn, clock, **kw) -> DynamicBatcher:
        b = DynamicBatcher(fn, clock=clock, max_batch_size=2, max_delay_ms=0, max_queue=64,
                           max_concurrent_batches=1, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close(drain=False, timeout_s=WAIT_S)


@pytest.mark.timeout(30)
def test_a_request_predicted_past_the_budget_is_refused_at_once_and_one_that_fits_is_served(batcher):
    clock, fn = ManualClock(), Held()
    b = batcher(fn, clock, max_latency_ms=1000)
    first = [b.submit(1), b.submit(2)]  # nothing measured yet: admitted on max_queue alone
    assert fn.started() == [1, 2]
    clock.advance(0.4)  # the first batch of 2 takes 0.4 s
    fn.release.release()
    assert [f.result(WAIT_S) for f in first] == [2, 4]

    running = [b.submit(3), b.submit(4)]  # at t=0.4, expected to end at 0.8
    assert fn.started() == [3, 4]
    clock.advance(0.1)
    # t=0.5: 5 would go at 0.8 and take 0.4 (0.7 s); 6 joins its batch (0.7 s); 7 would start a
    # batch after it, at 1.2, answered at 1.6: 1.1 s > 1 s
    queued = [b.submit(5), b.submit(6)]
    with pytest.raises(Overloaded, match=r"answered in about 1100 ms \(2 requests queued, 1 batches running.*"
                                         r"max_latency_ms=1000"):
        b.submit(7)
    stats = b.stats()
    assert (stats["rejected"], stats["rejected_latency"], stats["queue_depth"]) == (1, 1, 2)
    clock.advance(0.2)  # t=0.7: the same place is now answered in 0.9 s
    late = b.submit(7)
    assert b.stats()["rejected"] == 1
    for expected in ([5, 6], [7]):
        fn.release.release()
        assert fn.started() == expected
    fn.release.release()
    assert [f.result(WAIT_S) for f in running + queued + [late]] == [6, 8, 10, 12, 14]


@pytest.mark.timeout(30)
def test_without_a_budget_only_max_queue_refuses(batcher):
    clock, fn = ManualClock(), Held()
    b = batcher(fn, clock)
    first = [b.submit(1), b.submit(2)]
    assert fn.started() == [1, 2]
    clock.advance(5.0)  # a slow batch: with a budget, the queue below would be refused
    fn.release.release()
    [f.result(WAIT_S) for f in first]
    futures = [b.submit(i) for i in range(10)]
    assert b.stats()["rejected"] == 0
    for _ in range(5):
        fn.release.release()
    assert [f.result(WAIT_S) for f in futures] == [2 * i for i in range(10)]


@pytest.mark.timeout(30)
def test_a_slow_first_batch_does_not_lock_out_an_idle_batcher(batcher):
    clock, fn = ManualClock(), Held()
    b = batcher(fn, clock, max_latency_ms=100)
    first = b.submit(1)
    assert fn.started() == [1]
    clock.advance(30.0)  # a first batch 300x over the budget (workers starting, caches cold)
    fn.release.release()
    assert first.result(WAIT_S) == 2
    later = b.submit(2)  # idle: it starts at once, whatever the estimate says
    assert fn.started() == [2]
    clock.advance(0.05)
    fn.release.release()
    assert later.result(WAIT_S) == 4 and b.stats()["rejected"] == 0


def test_the_budget_is_validated():
    with pytest.raises(ValueError, match=r"`max_latency_ms` must be a finite number > 0 \(milliseconds\) or None. "
                                         r"Found: 0."):
        BatcherConfig(max_batch_size=2, max_delay_ms=0, max_queue=4, max_latency_ms=0)
    assert BatcherConfig(max_batch_size=2, max_delay_ms=0, max_queue=4, max_latency_ms=250).max_latency_ms == 250
