"""The benchmark harness measures what it claims: PSS of a process tree, clean sampler threads,
sane figures from compare()."""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from gpufeed._observe.memory import sampler_wait
from gpufeed.compare import SAMPLER_THREAD_NAME, PeakPSS, format_bytes, system_shmem_bytes
from gpufeed.compare._compare import batch_size_of, compare, touch_batch
from gpufeed.compare._datasets import SyntheticImageDataset
from gpufeed.compare._environment import cpu_model, describe_environment
from gpufeed.serve import ManualClock

MiB = 1 << 20

_ALLOCATE_200_MB = """
import sys, time
block = b"\\x01" * (200 << 20)   # bytes * n writes every page
print("ready", flush=True)
sys.stdin.readline()
"""


def _tree_rss_bytes() -> int:
    import psutil

    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]


def _sampled(mem: PeakPSS, more: int, timeout_s: float = 20.0) -> None:
    """Return once the sampler thread has taken ``more`` samples after this call."""
    target = mem.num_samples + more
    deadline = time.monotonic() + timeout_s
    while mem.num_samples < target:
        assert time.monotonic() < deadline, f"{mem.num_samples} of {target} samples in {timeout_s} s"
        time.sleep(mem.interval_s / 2)


def _touch_pages_and_wait(buf: mmap.mmap, ready: mp.synchronize.Event, done: mp.synchronize.Event) -> None:
    bytes(memoryview(buf)[:: mmap.PAGESIZE])  # maps every page of the inherited mapping here too
    ready.set()
    done.wait(30)


def _footprint_of_unmapped_memfd(nbytes: int) -> tuple[PeakPSS, int | None]:
    """A sampler's readings while this process writes ``nbytes`` into a memfd it never maps,
    and the growth of the system's Shmem over the same window (None: unreadable)."""
    fd = os.memfd_create("gpufeed-test-unmapped")
    try:
        before = system_shmem_bytes()
        with PeakPSS(interval_s=0.01) as mem:
            chunk = b"\x03" * MiB
            for _ in range(nbytes // MiB):
                os.write(fd, chunk)  # shared pages exist, held by an fd, mapped by no process
            _sampled(mem, 2)
            after = system_shmem_bytes()
    finally:
        os.close(fd)
    return mem, None if before is None or after is None else after - before


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs os.memfd_create (Linux)")
def test_footprint_counts_shared_memory_nobody_maps() -> None:
    # The footprint reads the system's Shmem, which other processes change too: a window in
    # which they released shared memory (the system grew by less than was written) says nothing
    # of the footprint, and is measured again.
    for _ in range(5):
        mem, system_growth = _footprint_of_unmapped_memfd(100 * MiB)
        if not mem.footprint_exact or system_growth is None:
            pytest.skip("Pss_Shmem or /proc/meminfo Shmem not readable here")
        if system_growth >= 95 * MiB:
            break
    else:
        pytest.skip("other processes released shared memory during each of 5 windows; nothing to conclude")
    assert mem.peak_bytes - mem.baseline_bytes < 20 * MiB  # PSS cannot see them
    assert mem.peak_footprint_bytes - mem.baseline_bytes >= 90 * MiB  # the footprint does


def test_sampler_thread_is_named_and_gone_after_exit() -> None:
    mem = PeakPSS(interval_s=0.01)
    with mem:
        assert mem.running
        assert len(_sampler_threads()) == 1
        assert _sampler_threads()[0].daemon
        _sampled(mem, 1)
    assert not mem.running
    assert _sampler_threads() == []
    mem.stop()  # idempotent


def test_sampler_thread_is_gone_after_an_exception() -> None:
    with pytest.raises(KeyError):
        with PeakPSS(interval_s=0.01):
            raise KeyError("boom")
    assert _sampler_threads() == []


def test_sampler_wait_keeps_sampling_within_its_cpu_share() -> None:
    assert sampler_wait(0.05, 0.030, None) == 0.05  # no cap: the interval
    assert sampler_wait(0.05, 0.030, 0.03) == pytest.approx(0.97)  # 30 ms of CPU in each second
    assert sampler_wait(0.05, 0.001, 0.03) == 0.05  # a cheap sample keeps the interval
    for cost in (0.001, 0.01, 0.03, 0.2):
        wait = sampler_wait(0.05, cost, 0.03)
        assert cost / (cost + wait) <= 0.03 + 1e-12


def test_a_request_samples_at_once_whatever_the_interval() -> None:
    with PeakPSS(interval_s=3600, cpu_share=0.01) as mem:
        assert mem.num_samples == 1  # the one on entry
        block = bytearray(b"\x01") * (64 * MiB)  # written: resident
        mem.request()
        deadline = time.monotonic() + 20
        while mem.num_samples < 2:
            assert time.monotonic() < deadline, "the requested sample never came"
            time.sleep(0.01)
        assert mem.peak_bytes - mem.baseline_bytes >= 60 * MiB
        assert mem.sampler_cpu_s > 0
        del block
    assert mem.to_dict()["sampler_cpu_s"] == mem.sampler_cpu_s


def test_peak_pss_rejects_bad_interval_and_double_start() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        PeakPSS(interval_s=0)
    with pytest.raises(ValueError, match="cpu_share"):
        PeakPSS(cpu_share=0)
    with PeakPSS() as mem:
        with pytest.raises(RuntimeError):
            mem.start()


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * MiB) == "3.0 MiB"
    assert format_bytes(5 << 30) == "5.0 GiB"
    assert format_bytes(-2 * MiB) == "-2.0 MiB"


def test_environment_records_what_a_result_needs() -> None:
    env = describe_environment(num_workers=2)
    for key in ("gpufeed", "torch", "numpy", "cv2", "python", "cpu_model", "logical_cores", "decode_backend"):
        assert key in env
    assert env["num_workers"] == 2
    assert env["torch"] == torch.__version__
    assert isinstance(env["logical_cores"], int) and env["logical_cores"] >= 1
    json.dumps(env)  # stored in JSON results


def test_cpu_model_reads_cpuinfo(tmp_path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\nflags\t: fpu\n")
    assert cpu_model(str(f)) == "Test CPU @ 1.00GHz"
    assert cpu_model(str(tmp_path / "missing")) != ""


def test_batch_size_and_touch() -> None:
    t = torch.arange(24, dtype=torch.uint8).reshape(4, 6)
    assert batch_size_of(t) == 4
    assert batch_size_of((t, torch.zeros(4))) == 4
    assert batch_size_of({"x": t}) == 4
    assert batch_size_of([1, 2, 3]) == 3
    # detection's tuple(zip(*samples)): 2 samples, not the first image's 3 channels
    images = (torch.zeros(3, 5, 7), torch.zeros(3, 6, 4))
    targets = ({"boxes": torch.zeros(2, 4)}, {"boxes": torch.zeros(0, 4)})
    assert batch_size_of((images, targets)) == 2
    assert batch_size_of([list(images), list(targets), [1, 2]]) == 2
    # views collated by default_collate: the batch dimension, as before
    views = [torch.zeros(4, 3, 8, 8), torch.zeros(4, 3, 4, 4)]
    assert batch_size_of((views, torch.zeros(4))) == 4
    assert batch_size_of((views, [torch.zeros(4), torch.zeros(4)])) == 4
    assert touch_batch(t) == 0
    assert touch_batch((t[1:], None)) == 6
    assert touch_batch(torch.empty(0, 3)) is None


def test_synthetic_dataset_samples() -> None:
    ds = SyntheticImageDataset(300)
    assert len(ds) == 300 and ds.sample_bytes == 3 * 224 * 224
    x = ds[257]
    assert x.shape == (3, 224, 224) and x.dtype == torch.uint8
    assert int(x.min()) == int(x.max()) == 1
    with pytest.raises(IndexError):
        ds[300]


def _list_loader(num_batches: int, delay_s: float = 0.0, clock: ManualClock | None = None):
    """Batches of 8 rows, each costing ``delay_s`` seconds on ``clock`` (exact, whatever else the
    machine runs)."""
    def factory():
        def gen():
            for i in range(num_batches):
                if clock is not None:
                    clock.advance(delay_s)
                yield torch.full((8, 3), i)
        return gen()
    return factory


def test_each_round_samples_at_its_first_batch_within_a_cpu_share(monkeypatch) -> None:
    import gpufeed.compare._compare as harness

    made: list[PeakPSS] = []
    requests: list[int] = []

    class Spy(PeakPSS):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def request(self) -> None:
            requests.append(len(made))
            super().request()

    monkeypatch.setattr(harness, "PeakPSS", Spy)
    clock = ManualClock()
    compare({"a": _list_loader(4, 0.01, clock)}, num_rounds=2, num_warmup_rounds=1, clock=clock.now)
    assert len(made) == 3 and requests == [1, 2, 3]  # one per round, at its first batch
    assert all(m.cpu_share == 0.03 for m in made)
    compare({"a": _list_loader(4, 0.01, clock)}, num_rounds=1, num_warmup_rounds=0, clock=clock.now,
            sampler_cpu_share=None)
    assert made[-1].cpu_share is None


def test_compare_on_two_trivial_loaders() -> None:
    clock = ManualClock()  # 30 ms vs 2 ms per batch, whatever else the machine runs
    result = compare(
        {"slow": _list_loader(6, 0.03, clock), "fast": _list_loader(6, 0.002, clock)},
        num_batches=5,
        num_rounds=3,
        num_warmup_rounds=1,
        sample_interval_s=0.01,
        clock=clock.now,
    )
    assert result.baseline == "slow"
    assert [s.name for s in result.loaders] == ["slow", "fast"]
    for s, per_batch_s in zip(result.loaders, (0.03, 0.002)):
        assert len(s.rounds) == 3
        assert all(r.num_batches == 5 and r.num_samples == 40 for r in s.rounds)
        # the first batch is start-up; the other 4 are the steady state
        for r in s.rounds:
            assert r.startup_s == pytest.approx(per_batch_s) and r.steady_s == pytest.approx(4 * per_batch_s)
            assert r.total_batches_per_s == pytest.approx(1 / per_batch_s)
        assert s.median_batches_per_s == pytest.approx(1 / per_batch_s)
        assert s.median_samples_per_s == pytest.approx(8 * s.median_batches_per_s)
        assert s.peak_pss_bytes > 10 * MiB
    assert result.ratio("slow") == pytest.approx(1.0)
    assert result.ratio("fast") == pytest.approx(15.0)  # 30 ms / 2 ms
    assert result.paired_ratios("fast") == pytest.approx([15.0] * 3)
    assert result.memory_ratio("fast") > 0
    d = result.to_dict()
    json.dumps(d)
    assert d["ratios"]["fast"]["batches_per_s"] == result.ratio("fast")
    table = result.format_table()
    assert "slow" in table and "fast" in table and "batches/s" in table
    assert _sampler_threads() == []


def test_compare_rotate_starts_each_round_one_loader_further_on() -> None:
    calls: list[str] = []

    def named(name: str):
        def factory():
            calls.append(name)
            return _list_loader(3)()
        return factory

    result = compare({n: named(n) for n in "abc"}, num_batches=2, num_rounds=3,
                     num_warmup_rounds=1, sample_interval_s=0.01, rotate=True)
    # warm-up round 0, then counted rounds 1-3: the start moves on by one each round
    assert calls == list("abc" "bca" "cab" "abc")
    assert result.rotated and result.to_dict()["rotated"] is True
    assert [len(s.rounds) for s in result.loaders] == [3, 3, 3]
    calls.clear()
    assert not compare({n: named(n) for n in "ab"}, num_batches=2, num_rounds=2,
                       num_warmup_rounds=0, sample_interval_s=0.01).rotated
    assert calls == list("abab")


def test_compare_validates_arguments() -> None:
    f = _list_loader(3)
    with pytest.raises(ValueError, match="num_rounds"):
        compare({"a": f}, num_rounds=0)
    with pytest.raises(ValueError, match="num_batches"):
        compare({"a": f}, num_batches=1)
    with pytest.raises(ValueError, match="baseline"):
        compare({"a": f}, baseline="b")
    with pytest.raises(ValueError, match="factories"):
        compare({})


class _Spinning(torch.utils.data.Dataset):
    """Each item burns ``cpu_s`` of its process's CPU time (measured on the CPU clock, so a
    busy machine makes it take longer, never count less)."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.process_time() + self.cpu_s
        while time.process_time() < end:
            pass
        return torch.tensor(i)


@pytest.mark.timeout(120)
def test_cpu_per_sample_counts_the_workers_and_the_parent() -> None:
    per_item = 0.01
    spin_parent = 0.02

    def consume(batch):
        end = time.process_time() + spin_parent
        while time.process_time() < end:
            pass

    def factory():
        # one worker, one batch ahead: batches 2-5 are asked for after the first is handed out
        return torch.utils.data.DataLoader(_Spinning(24, per_item), batch_size=4, num_workers=1,
                                           prefetch_factor=1)

    result = compare({"spin": factory}, num_rounds=1, num_warmup_rounds=0, sample_interval_s=0.05,
                     consume=consume)
    r = result.summary("spin").rounds[0]
    assert r.steady_samples == 20  # 6 batches of 4, the first excluded
    # the consumer's spin on the 5 steady batches ran in the parent, the 16 items of batches 2-5
    # spun in the worker after the first batch was handed out
    # (in seconds: the per-image figures divide by the fitted rate, which the machine's speed moves)
    assert r.parent_cpu_s >= spin_parent * 5 * 0.99
    assert r.cpu_s - r.parent_cpu_s >= per_item * 16 * 0.99
    made = r.samples_per_s * r.steady_s
    assert r.cpu_ms_per_sample == pytest.approx(1e3 * r.cpu_s / made)
    assert r.parent_cpu_ms_per_sample == pytest.approx(1e3 * r.parent_cpu_s / made)
    assert result.summary("spin").median_cpu_ms_per_sample == r.cpu_ms_per_sample
    assert "cpu/img" in result.format_table()
    assert json.loads(json.dumps(result.to_dict()))["loaders"][0]["median_cpu_ms_per_sample"] > 0


def test_workers_delivering_in_step_are_not_over_counted() -> None:
    """Two workers that hand over their batches together every 0.1 s make 20 batches a second.
    The window from the first batch to the last would count the batch that came with the first
    (made before the window opened): 11 batches in 0.5 s, 22 a second. The fitted rate is 20."""
    clock = ManualClock()

    def in_step():
        def gen():
            for i in range(12):
                if i and i % 2 == 0:
                    clock.advance(0.1)
                yield torch.full((8, 3), i)
        return gen()

    def alternating():
        def gen():
            for i in range(12):
                if i:
                    clock.advance(0.05)
                yield torch.full((8, 3), i)
        return gen()

    result = compare({"in step": in_step, "alternating": alternating}, num_rounds=1, num_warmup_rounds=0,
                     sample_interval_s=0.01, clock=clock.now)
    for name in ("in step", "alternating"):
        r = result.summary(name).rounds[0]
        assert r.batches_per_s == pytest.approx(20.0, rel=0.02), name
        assert r.samples_per_s == pytest.approx(160.0, rel=0.02), name
    assert result.summary("in step").rounds[0].steady_s == pytest.approx(0.5)  # 11 batches after the first
    assert result.ratio("in step", "alternating") == pytest.approx(1.0, rel=0.02)
