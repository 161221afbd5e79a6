"""gpufeed.serve.DynamicBatcher: batch formation and the oldest-request timer (on a ManualClock,
no sleeps), deadlines, cancellation, backpressure, failures, close, submitters, metrics."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from gpufeed.serve import (
    BatcherClosedError,
    BatcherCollector,
    BatcherConfig,
    DynamicBatcher,
    Histogram,
    ManualClock,
    Overloaded,
)

WAIT_S = 10.0  # real-time bound on anything that should take milliseconds


def batcher_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpufeed-batcher")]


class Recorder:
    """A model function that doubles its inputs and records every batch it saw."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list] = []
        self.started = threading.Event()
        self.gate = gate

    def __call__(self, inputs: list) -> list:
        self.calls.append(list(inputs))
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        return [2 * x for x in inputs]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make(clock):
    made: list[DynamicBatcher] = []

    def make(fn, **kw) -> DynamicBatcher:
        kw.setdefault("max_batch_size", 8)
        kw.setdefault("max_delay_ms", 250)  # 0.25 s: virtual steps of 0.125 are exact in binary
        kw.setdefault("max_queue", 64)
        batcher = DynamicBatcher(fn, clock=clock, **kw)
        made.append(batcher)
        return batcher

    yield make
    for b in made:
        b.close(drain=False, timeout_s=WAIT_S)
    assert batcher_threads() == []


def one_busy_slot(make, clock, first: int):
    """A batcher with one model slot, busy with ``first`` (0.25 s after it arrived) until the
    returned gate is set."""
    gate = threading.Event()
    fn = Recorder(gate)
    b = make(fn, max_concurrent_batches=1)
    running = b.submit(first)
    clock.advance(0.25)
    assert fn.started.wait(WAIT_S)
    return fn, b, gate, running


def results(futures) -> list:
    return [f.result(timeout=WAIT_S) for f in futures]


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_batch_size": 0}, "`max_batch_size` must be an int >= 1. Found: 0."),
        ({"max_delay_ms": -1}, "`max_delay_ms` must be a finite number >= 0"),
        ({"max_queue": True}, "`max_queue` must be an int >= 1. Found: True."),
        ({"max_concurrent_batches": 0}, "`max_concurrent_batches`"),
        ({"preferred_batch_sizes": (4, 16)}, "`preferred_batch_sizes` must be a tuple of ints in 1..max_batch_size"),
        ({"default_timeout_s": 0}, "`default_timeout_s`"),
    ],
)
def test_config_rejects_bad_values_with_the_value_found(kw, match):
    args = {"max_batch_size": 8, "max_delay_ms": 5, "max_queue": 10, **kw}
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        BatcherConfig(**args)


def test_config_sorts_preferred_sizes_and_pads_to_the_next_one():
    cfg = BatcherConfig(max_batch_size=8, max_delay_ms=1, max_queue=1, preferred_batch_sizes=(8, 2, 4))
    assert cfg.preferred_batch_sizes == (2, 4, 8)
    assert [cfg.padded_size(n) for n in (1, 2, 3, 5, 8)] == [2, 2, 4, 8, 8]


# -- batch formation ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_timer_starts_at_the_oldest_request(make, clock):
    fn = Recorder()
    b = make(fn)
    first = b.submit(1)
    clock.advance(0.125)
    second = b.submit(2)
    clock.wait_idle()
    assert fn.calls == [] and not first.done()
    clock.advance(0.125)  # the oldest has waited 0.25 s; the second only 0.125 s
    assert results([first, second]) == [2, 4]
    assert fn.calls == [[1, 2]]


@pytest.mark.timeout(30)
def test_timer_is_not_counted_from_the_previous_batch(make, clock):
    fn = Recorder()
    b = make(fn)
    clock.advance(100.0)  # idle for a long time: a lone request still waits only max_delay_ms
    a = b.submit(1)
    clock.wait_idle()
    assert not a.done()
    clock.advance(0.25)
    assert results([a]) == [2]
    clock.advance(0.125)  # batch ended at 100.25; the next request arrives at 100.375
    late = b.submit(3)
    clock.advance(0.125)  # 0.25 after the previous batch, but the request has waited 0.125
    clock.wait_idle()
    assert not late.done()
    clock.advance(0.125)
    assert results([late]) == [6]


@pytest.mark.timeout(30)
def test_a_full_batch_goes_at_once_and_the_rest_waits(make, clock):
    fn = Recorder()
    b = make(fn, max_batch_size=4)
    futures = [b.submit(i) for i in range(5)]
    assert results(futures[:4]) == [0, 2, 4, 6]
    clock.wait_idle()
    assert not futures[4].done()
    clock.advance(0.25)
    assert results(futures[4:]) == [8]
    assert fn.calls == [[0, 1, 2, 3], [4]]


@pytest.mark.timeout(30)
def test_zero_delay_dispatches_whatever_is_queued(make, clock):
    fn = Recorder()
    b = make(fn, max_delay_ms=0)
    assert results([b.submit(5)]) == [10]


@pytest.mark.timeout(30)
def test_a_busy_slot_holds_requests_which_go_as_soon_as_it_frees(make, clock):
    fn, b, gate, a = one_busy_slot(make, clock, 1)
    later = [b.submit(2), b.submit(3)]
    clock.advance(1.0)  # their timer ran out while the only slot is busy
    clock.wait_idle()
    assert len(fn.calls) == 1
    gate.set()
    assert results([a, *later]) == [2, 4, 6]  # no clock advance needed: the slot freed
    assert fn.calls == [[1], [2, 3]]


@pytest.mark.timeout(30)
def test_a_freed_slot_takes_full_batches_in_order_and_a_partial_one_still_waits_for_its_timer(make, clock):
    fn, b, gate, first = one_busy_slot(make, clock, 0)
    queued = [b.submit(i) for i in range(1, 20)]  # two full batches of 8, then 3
    gate.set()
    assert results([first, *queued[:16]]) == [2 * i for i in range(17)]
    clock.wait_idle()
    assert fn.calls == [[0], list(range(1, 9)), list(range(9, 17))]  # no clock advance: they were full
    assert not any(f.done() for f in queued[16:])  # their oldest has waited 0 of 0.25 s
    clock.advance(0.25)
    assert results(queued[16:]) == [34, 36, 38]
    assert fn.calls[-1] == [17, 18, 19]
    stats = b.stats()
    assert stats["batches"] == 4 and stats["completed"] == 20 and stats["queue_depth"] == 0
    assert stats["running_batches"] == 0 and stats["batch_size_hist"]["count"] == 4


@pytest.mark.timeout(30)
def test_a_request_expiring_while_every_slot_is_busy_fails_at_its_deadline(make, clock):
    fn, b, gate, running = one_busy_slot(make, clock, 1)
    doomed = b.submit(2, timeout_s=0.125)
    kept = b.submit(3)
    clock.advance(0.125)
    with pytest.raises(TimeoutError, match="never reached the model"):
        doomed.result(timeout=WAIT_S)  # while the only slot is still busy
    assert not running.done()
    gate.set()
    clock.advance(0.125)  # kept's timer (it arrived at 0.25)
    assert results([running, kept]) == [2, 6]
    assert fn.calls == [[1], [3]] and b.stats()["expired"] == 1


@pytest.mark.timeout(30)
def test_concurrent_batches_run_at_once(make, clock):
    seen = threading.Barrier(3, timeout=WAIT_S)

    def fn(inputs):
        seen.wait()  # three batches must be inside fn together
        return inputs

    b = make(fn, max_batch_size=1, max_concurrent_batches=3)
    futures = [b.submit(i) for i in range(3)]
    assert results(futures) == [0, 1, 2]


@pytest.mark.timeout(30)
def test_padding_to_a_preferred_size_repeats_the_last_input_and_drops_its_results(make, clock):
    fn = Recorder()
    b = make(fn, preferred_batch_sizes=(4, 8))
    futures = [b.submit(i) for i in (1, 2, 3)]
    clock.advance(0.25)
    assert results(futures) == [2, 4, 6]
    assert fn.calls == [[1, 2, 3, 3]]
    assert b.stats()["batch_size_hist"]["count"] == 1 and b.stats()["batch_size_mean"] == 3


@pytest.mark.timeout(30)
def test_collate_true_hands_fn_torch_default_collate():
    torch = pytest.importorskip("torch")
    with DynamicBatcher(lambda t: t * 2, max_batch_size=4, max_delay_ms=0, max_queue=8, collate=True) as b:
        out = b.submit(torch.tensor([1.0, 2.0])).result(timeout=WAIT_S)
    assert torch.equal(out, torch.tensor([2.0, 4.0]))


# -- deadlines, cancellation, backpressure --------------------------------------------------------


@pytest.mark.timeout(30)
def test_an_expired_request_fails_before_running_and_takes_no_slot(make, clock):
    fn = Recorder()
    b = make(fn, max_batch_size=2)
    doomed = b.submit(1, timeout_s=0.125)
    kept = b.submit(2)
    clock.advance(0.125)
    with pytest.raises(TimeoutError, match=r"timeout_s=0\.125.*never reached the model"):
        doomed.result(timeout=WAIT_S)
    third = b.submit(3)  # fills the batch the expired request would have taken
    assert results([kept, third]) == [4, 6]
    assert fn.calls == [[2, 3]]
    assert b.stats()["expired"] == 1


@pytest.mark.timeout(30)
def test_default_timeout_applies_to_requests_without_one(make, clock):
    b = make(Recorder(), default_timeout_s=0.125)
    f = b.submit(1)
    clock.advance(0.125)
    with pytest.raises(TimeoutError):
        f.result(timeout=WAIT_S)


@pytest.mark.timeout(30)
def test_a_cancelled_request_is_dropped_and_frees_its_queue_place(make, clock):
    fn = Recorder()
    b = make(fn, max_queue=2)
    a, c = b.submit(1), b.submit(2)
    assert a.cancel()
    clock.wait_idle()
    d = b.submit(3)  # the cancelled one no longer counts against max_queue
    clock.advance(0.25)
    assert results([c, d]) == [4, 6]
    assert fn.calls == [[2, 3]]
    assert b.stats()["cancelled"] == 1


@pytest.mark.timeout(30)
def test_a_full_queue_rejects_at_once(make, clock):
    b = make(Recorder(), max_queue=2)
    b.submit(1), b.submit(2)
    with pytest.raises(Overloaded, match=r"2 requests queued, max_queue=2"):
        b.submit(3)
    assert b.stats()["rejected"] == 1 and b.stats()["queue_depth"] == 2


# -- failures -------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_an_exception_in_fn_fails_its_batch_only_and_serving_goes_on(make, clock):
    def fn(inputs):
        if "bad" in inputs:
            raise KeyError("bad input")
        return inputs

    b = make(fn, max_batch_size=2)
    failed = [b.submit("bad"), b.submit("ok")]
    for f in failed:
        with pytest.raises(KeyError) as info:
            f.result(timeout=WAIT_S)
        assert any("batch #1" in note for note in info.value.__notes__)
    assert results([b.submit("x"), b.submit("y")]) == ["x", "y"]
    stats = b.stats()
    assert (stats["failed"], stats["completed"], stats["batches"]) == (2, 2, 2)


@pytest.mark.timeout(30)
def test_single_items_fail_through_validate_or_an_exception_result(make, clock):
    def validate(x):
        if x < 0:
            raise ValueError(f"negative input {x}")

    b = make(lambda xs: [ArithmeticError("zero") if x == 0 else 10 // x for x in xs], validate=validate)
    neg, zero, five = b.submit(-1), b.submit(0), b.submit(5)
    with pytest.raises(ValueError, match="negative input -1"):
        neg.result(timeout=WAIT_S)
    clock.advance(0.25)
    with pytest.raises(ArithmeticError, match="zero"):
        zero.result(timeout=WAIT_S)
    assert five.result(timeout=WAIT_S) == 2
    stats = b.stats()
    assert (stats["invalid"], stats["failed"], stats["completed"]) == (1, 1, 1)


@pytest.mark.timeout(30)
@pytest.mark.timeout(30)
def test_a_wrong_number_of_results_fails_the_batch_with_a_clear_error(make, clock):
    b = make(lambda xs: xs[:1], max_batch_size=2)
    futures = [b.submit(1), b.submit(2)]  # a full batch: dispatched without the timer
    for f in futures:
        with pytest.raises(ValueError, match="returned 1 results for a batch of 2 inputs"):
            f.result(timeout=WAIT_S)


# -- close ----------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_close_drains_queued_requests_without_waiting_for_the_timer(clock):
    fn = Recorder()
    b = DynamicBatcher(fn, max_batch_size=8, max_delay_ms=250, max_queue=8, clock=clock)
    futures = [b.submit(i) for i in range(3)]
    b.close(timeout_s=WAIT_S)  # the virtual clock never moves: only the drain can dispatch
    assert results(futures) == [0, 2, 4]
    assert batcher_threads() == []
    b.close()  # idempotent
    with pytest.raises(BatcherClosedError):
        b.submit(1)


@pytest.mark.timeout(30)
def test_close_without_drain_cancels_queued_requests_and_lets_running_ones_finish(clock):
    gate = threading.Event()
    fn = Recorder(gate)
    b = DynamicBatcher(fn, max_batch_size=1, max_delay_ms=0, max_queue=8, clock=clock)
    running = b.submit(1)
    assert fn.started.wait(WAIT_S)
    queued = b.submit(2)
    threading.Timer(0.2, gate.set).start()
    b.close(drain=False, timeout_s=WAIT_S)
    assert running.result(timeout=0) == 2
    assert queued.cancelled()
    assert batcher_threads() == []


@pytest.mark.timeout(30)
def test_close_timeout_cancels_what_is_still_queued(clock):
    gate = threading.Event()
    fn = Recorder(gate)
    b = DynamicBatcher(fn, max_batch_size=1, max_delay_ms=0, max_queue=8, clock=clock)
    running = b.submit(1)
    assert fn.started.wait(WAIT_S)
    queued = b.submit(2)
    b.close(timeout_s=0.05)  # fn is still blocked on the gate: it outlives close's 0.05 s
    assert queued.cancelled() and not running.done()
    gate.set()
    assert running.result(timeout=WAIT_S) == 2
    deadline = time.monotonic() + WAIT_S
    while batcher_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher_threads() == []


@pytest.mark.timeout(30)
def test_a_forgotten_batcher_is_closed_by_the_garbage_collector():
    import gc

    b = DynamicBatcher(Recorder(), max_batch_size=2, max_delay_ms=0, max_queue=2)
    assert b.submit(1).result(timeout=WAIT_S) == 2
    del b
    gc.collect()
    assert batcher_threads() == []


# -- submitters -----------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_many_threads_submit_and_each_gets_its_own_result():
    fn = Recorder()
    with DynamicBatcher(fn, max_batch_size=16, max_delay_ms=1, max_queue=1000, max_concurrent_batches=2) as b:
        out: dict[int, list] = {}

        def client(k: int) -> None:
            futures = [b.submit(k * 1000 + i) for i in range(50)]
            out[k] = results(futures)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    assert out == {k: [2 * (k * 1000 + i) for i in range(50)] for k in range(8)}
    assert all(1 <= len(c) <= 16 for c in fn.calls)
    assert sum(len(c) for c in fn.calls) == 400
    assert batcher_threads() == []


@pytest.mark.timeout(30)
def test_asyncio_clients_await_results_and_a_cancelled_task_cancels_its_request(make, clock):
    fn = Recorder()
    b = make(fn)

    async def main():
        tasks = [asyncio.ensure_future(b.infer(i)) for i in range(4)]
        await asyncio.sleep(0)  # the requests are queued
        tasks[0].cancel()
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, clock.wait_idle)
        clock.advance(0.25)
        return await asyncio.wait_for(asyncio.gather(*tasks[1:]), WAIT_S), tasks[0].cancelled()

    got, cancelled = asyncio.run(main())
    assert got == [2, 4, 6] and cancelled
    assert fn.calls == [[1, 2, 3]]


# -- metrics --------------------------------------------------------------------------------------


def test_histogram_quantiles_interpolate_inside_the_bucket():
    h = Histogram([1.0, 2.0, 4.0])
    assert math.isnan(h.quantile(0.5))
    for v in (0.5, 1.5, 1.5, 3.0):
        h.observe(v)
    assert h.counts == [1, 2, 1, 0]
    assert h.quantile(0.5) == pytest.approx(1.5)  # rank 2: halfway through the (1, 2] bucket
    assert h.quantile(1.0) == pytest.approx(4.0)
    h.observe(100.0)
    assert h.quantile(1.0) == 4.0  # +Inf bucket: the highest finite bound


@pytest.mark.timeout(30)
def test_stats_and_prometheus_families(make, clock):
    prometheus_client = pytest.importorskip("prometheus_client")
    b = make(Recorder(), name="resnet")
    futures = [b.submit(i) for i in range(3)]
    clock.advance(0.25)
    results(futures)
    stats = b.stats()
    assert (stats["requests"], stats["completed"], stats["batches"]) == (3, 3, 1)
    assert 0.1 < stats["queue_wait_p99_s"] <= 0.25  # every wait was 0.25: the (0.1, 0.25] bucket
    registry = prometheus_client.CollectorRegistry()
    registry.register(BatcherCollector(b))
    text = prometheus_client.generate_latest(registry).decode()
    assert 'gpufeed_serve_requests_total{batcher="resnet"} 3.0' in text
    assert 'gpufeed_serve_batch_size_bucket{batcher="resnet",le="4.0"} 1.0' in text
    assert 'gpufeed_serve_latency_seconds_count{batcher="resnet"} 3.0' in text


@pytest.mark.timeout(30)
def test_an_idle_batcher_does_not_spin():
    with DynamicBatcher(Recorder(), max_batch_size=8, max_delay_ms=5, max_queue=8, max_concurrent_batches=2):
        start = time.process_time()
        time.sleep(1.0)
        used = time.process_time() - start
    # under 5% of a core (a spinning thread: ~100%); measured 0.000-0.001 s over 2 s
    assert used < 0.05, f"idle batcher used {used:.3f} CPU s in 1 s"  # 1% would be 0.01 s
