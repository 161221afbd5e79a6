"""The CUDA feed on a real GPU: byte-identical batches, held batches, streams, memory, teardown.

Skipped without CUDA (see conftest.py); the CPU-side pieces are tested in tests/unit/test_cuda_feed_cpu.py.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import TensorDataset

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.cuda._feed import CudaFeed

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(image_folder):
    return image_folder(num_classes=4, per_class=24, seed=1)


def _dataset(folder):
    return ImageFolder(folder, transform=ResizeCenterCrop(64, 72))


@pytest.mark.parametrize("channels_last", [False, True])
def test_device_batches_byte_identical_to_cpu_path(folder, channels_last):
    cpu = list(FastLoader(_dataset(folder), batch_size=16, num_workers=2, channels_last=channels_last))
    gpu = list(FastLoader(_dataset(folder), batch_size=16, num_workers=2, channels_last=channels_last, device="cuda"))
    assert len(cpu) == len(gpu)
    for (ci, cl), (gi, gl) in zip(cpu, gpu):
        assert gi.device.type == "cuda" and gl.device.type == "cuda"
        assert torch.equal(ci, gi.cpu()) and torch.equal(cl, gl.cpu())
        assert gi.is_contiguous(memory_format=torch.channels_last) == channels_last


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_normalize_matches_cpu_normalize(folder, dtype):
    kw = dict(batch_size=16, num_workers=2, normalize=(MEAN, STD), dtype=dtype)
    cpu = list(FastLoader(_dataset(folder), **kw))
    gpu = list(FastLoader(_dataset(folder), device="cuda", **kw))
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for (ci, _), (gi, _) in zip(cpu, gpu):
        assert gi.dtype == dtype
        torch.testing.assert_close(gi.float().cpu(), ci.float(), atol=tol, rtol=tol)


def test_consumer_keeping_old_batches_sees_them_unchanged(folder):
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    held = []
    for images, _ in FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", prefetch_batches=3):
        torch.cuda._sleep(1_000_000)  # slow consumer: copies of later batches run meanwhile
        held.append(images)
    torch.cuda.synchronize()
    assert all(torch.equal(r, h.cpu()) for r, h in zip(reference, held))


def test_break_while_copies_are_queued_keeps_the_last_batch_intact(folder):
    """The CUDA iterator dies at ``break`` with copies still queued behind a busy consumer stream;
    their slots go back to the workers only once those copies finished."""
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    loader = FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", prefetch_batches=3,
                        persistent_workers=True)
    for k, (images, _) in enumerate(loader):
        if k == 0:
            torch.cuda._sleep(500_000_000)  # copies issued from now on wait behind this on the GPU
        if k == 4:  # issued after the sleep: its copy is still pending when the host loop breaks
            kept = images
            break
    for _ in loader:  # the next epoch's workers take the freed slots and overwrite them
        pass
    torch.cuda.synchronize()
    assert torch.equal(kept.cpu(), reference[4])
    loader.close()


def test_pin_memory_batch_dropped_right_after_a_non_blocking_copy_is_not_overwritten(folder):
    """The usual loop: ``x = x.to("cuda", non_blocking=True)`` drops the pinned host batch while its
    copy still waits behind the model's work; the slot must not be reused before the copy ran."""
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    got = []
    for images, _ in FastLoader(_dataset(folder), batch_size=8, num_workers=2, pin_memory=True):
        torch.cuda._sleep(20_000_000)  # "the model": the copy below queues behind it
        images = images.to("cuda", non_blocking=True)  # the host batch dies here
        got.append(images)
    torch.cuda.synchronize()
    assert all(torch.equal(r, g.cpu()) for r, g in zip(reference, got))


def test_batches_follow_the_current_stream(folder):
    side = torch.cuda.Stream()
    reference = [b[0] for b in FastLoader(_dataset(folder), batch_size=8, num_workers=1)]
    got = []
    loader = FastLoader(_dataset(folder), batch_size=8, num_workers=1, device="cuda")
    for k, (images, _) in enumerate(loader):
        stream = side if k % 2 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            got.append((images.float() * 1.0).cpu())  # consumed on alternating streams
    assert all(torch.equal(r.float(), g) for r, g in zip(reference, got))


def test_generic_nested_batches_move_every_tensor():
    ds = TensorDataset(torch.arange(40).float(), torch.arange(40))
    loader = FastLoader(ds, batch_size=8, num_workers=2, device="cuda",
                        collate_fn=lambda b: {"x": torch.stack([s[0] for s in b]), "meta": [torch.stack([s[1] for s in b]), "tag"]})
    for batch in loader:
        assert batch["x"].is_cuda and batch["meta"][0].is_cuda and batch["meta"][1] == "tag"


def test_gpu_memory_flat_over_many_epochs(folder):
    loader = FastLoader(_dataset(folder), batch_size=16, num_workers=2, persistent_workers=True, device="cuda",
                        normalize=(MEAN, STD))
    reserved = []
    for _ in range(12):
        for images, labels in loader:
            (images.mean() + labels.float().mean()).item()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert max(reserved[3:]) <= reserved[2]  # after warm-up, the caching allocator stops growing
    loader.close()


def test_close_unregisters_the_arena_and_leaves_no_workers(folder):
    from tests._procs import live_children

    loader = FastLoader(_dataset(folder), batch_size=16, num_workers=2, device="cuda", persistent_workers=True)
    first = next(iter(loader))
    registrar = loader._registrar
    assert registrar is not None and registrar._registered  # slots were page-locked
    images, labels = first[0].cpu(), first[1].cpu()
    loader.close()
    assert not registrar._registered
    # device tensors outlive the loader, with the values they had before close
    assert first[0].is_cuda and torch.equal(first[0].cpu(), images) and torch.equal(first[1].cpu(), labels)
    del loader
    gc.collect()
    assert live_children() == []


def test_pin_memory_gives_torch_pinned_batches_and_page_locks_no_arena_memory(folder):
    loader = FastLoader(_dataset(folder), batch_size=16, num_workers=2, pin_memory=True)
    images, labels = next(iter(loader))
    assert images.is_pinned() and labels.is_pinned()
    assert loader._registrar is None  # only the CUDA feed, which issues every copy, gets page-locked slots


def test_pin_memory_copy_on_a_side_stream_is_safe_wherever_the_batch_dies(folder):
    """The copy runs on a busy side stream, the host batch dies on the default stream (the loop
    rebinds it): torch's pinned memory knows the copy's stream, a guard on the releasing
    thread's current stream would not."""
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    side = torch.cuda.Stream()
    got = []
    for images, _ in FastLoader(_dataset(folder), batch_size=8, num_workers=2, pin_memory=True):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # the copy below queues behind this
            got.append(images.to("cuda", non_blocking=True))
        # ``images`` dies at the next iteration, on the default stream, with its copy still queued
    torch.cuda.synchronize()
    assert all(torch.equal(r, g.cpu()) for r, g in zip(reference, got))


def test_steady_state_never_synchronizes_the_host_and_copies_only_page_locked_memory(folder, monkeypatch):
    """A normalized channels_last feed after its first batches: no call in the loop blocks the host
    (``set_sync_debug_mode("error")`` raises on one), and every host tensor copied to the GPU is
    page-locked (a non_blocking copy from pageable memory is a hidden wait that mode misses)."""
    copied = []  # (non_blocking, source is page-locked) of every host-to-device copy
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type == "cuda":
            copied.append((bool(kwargs.get("non_blocking")), self.is_pinned()))
        return out

    monkeypatch.setattr(torch.Tensor, "to", to)
    loader = FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", channels_last=True,
                        normalize=(MEAN, STD), prefetch_batches=2)
    n = len(loader)
    sums = []
    try:
        for k, (images, labels) in enumerate(loader):
            assert images.is_contiguous(memory_format=torch.channels_last) and images.dtype == torch.float32
            sums.append(images.sum() + labels.sum())  # consumer work; never read back in the loop
            if k == 1:  # the first batches built the normalize constants and registered slots
                torch.cuda.set_sync_debug_mode("error")
            if k == n - 1:  # the steady state ends before the end of the epoch
                torch.cuda.set_sync_debug_mode("default")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(sums) == n and torch.isfinite(torch.stack(sums)).all()
    assert copied and len(copied) == 2 * n  # images and labels of every batch
    assert all(non_blocking and pinned for non_blocking, pinned in copied), copied


def _watch_unregister(loader):
    """Record, at the drain, whether copies were still queued on the loader's copy stream and, at
    every ``cudaHostUnregister``, whether the copy stream had drained (after a first batch)."""
    feed, registrar = loader._cuda_feed, loader._registrar
    assert isinstance(feed, CudaFeed) and registrar is not None
    seen: dict = {"queued_at_drain": None, "drained_at_unregister": []}
    drain, cudart = registrar._drain, registrar._cudart

    def watched_drain():
        seen["queued_at_drain"] = not feed.stream.query()
        drain()

    class Cudart:
        def cudaHostRegister(self, ptr, nbytes, flags):
            return cudart.cudaHostRegister(ptr, nbytes, flags)

        def cudaHostUnregister(self, ptr):
            seen["drained_at_unregister"].append(feed.stream.query())
            return cudart.cudaHostUnregister(ptr)

    registrar._drain, registrar._cudart = watched_drain, Cudart()
    return seen


def test_end_of_epoch_with_copies_queued_unregisters_after_the_copy_stream_drained(folder):
    """The loader is closed during the epoch; the arena closes when the epoch's engine ends, while
    the copies of the last batches still wait behind the consumer's work on the GPU."""
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    n = len(reference)
    loader = FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", prefetch_batches=3)
    it = iter(loader)
    got = [next(it)[0]]
    seen = _watch_unregister(loader)
    loader.close()  # deferred: the running engine keeps the arena open until the epoch ends
    for k, (images, _) in enumerate(it, start=1):
        if k == n - 7:  # copies issued from here on (the last 3) wait behind this on the GPU
            torch.cuda._sleep(2_000_000_000)
        got.append(images)
    assert seen["queued_at_drain"] is True, "premise: copies were still queued when the arena closed"
    assert seen["drained_at_unregister"] and all(seen["drained_at_unregister"])
    torch.cuda.synchronize()  # raises if a copy read unregistered memory and faulted
    assert all(torch.equal(r, g.cpu()) for r, g in zip(reference, got))


def test_a_dropped_iterator_then_close_unregisters_after_the_copy_stream_drained(folder):
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    loader = FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", prefetch_batches=3,
                        persistent_workers=True)
    seen = None
    for k, (images, _) in enumerate(loader):
        if k == 0:
            seen = _watch_unregister(loader)
            torch.cuda._sleep(2_000_000_000)  # copies issued from now on wait behind this
        if k == 4:
            kept = images
            break
    loader.close()  # the iterator is gone with its queued copies; the arena goes now
    assert seen is not None and seen["queued_at_drain"] is True, "premise: copies still queued at close"
    assert seen["drained_at_unregister"] and all(seen["drained_at_unregister"])
    torch.cuda.synchronize()
    assert torch.equal(kept.cpu(), reference[4])


def test_a_consumer_on_a_side_stream_gets_intact_batches(folder):
    """The whole loop runs on a side stream, slower than the copies; the default stream stays idle."""
    reference = [b[0].clone() for b in FastLoader(_dataset(folder), batch_size=8, num_workers=2)]
    side = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(side):
        for images, _ in FastLoader(_dataset(folder), batch_size=8, num_workers=2, device="cuda", prefetch_batches=3):
            torch.cuda._sleep(5_000_000)
            got.append(images.clone())  # read on the side stream, where the batch was handed out
    torch.cuda.synchronize()
    assert len(got) == len(reference) and all(torch.equal(r, g.cpu()) for r, g in zip(reference, got))


@pytest.mark.parametrize("wait_on_consumer", [True, False], ids=["wait", "nowait"])
@pytest.mark.parametrize("keep_references", [False, True], ids=["record_stream", "keep"])
def test_device_memory_stops_growing_while_the_cpu_runs_ahead_of_a_slow_model(wait_on_consumer, keep_references):
    """No host sync per batch (no .item()): the CPU queues batches as fast as the launch queue
    takes them while a slow model (a loop of matmuls on the consumer stream) runs behind. After
    the warm-up, torch.cuda.memory_allocated stops growing, and every batch arrived intact (its
    sum, accumulated on the GPU, equals the CPU's), for each guard variant of the feed."""
    n, batch = 240, 32
    data = torch.randint(0, 256, (n * batch, 3, 64, 64), dtype=torch.uint8)
    loader = FastLoader(TensorDataset(data), batch_size=batch, num_workers=2, device="cuda", prefetch_batches=2)
    loader._engine_context()  # the feed is made here; iter() reuses it
    loader._cuda_feed.wait_on_consumer, loader._cuda_feed.keep_references = wait_on_consumer, keep_references
    weight = torch.randn(2048, 2048, device="cuda")
    total = torch.zeros((), dtype=torch.int64, device="cuda")
    peaks = []
    for k, (images,) in enumerate(loader):
        x = weight
        for _ in range(8):  # the slow model: the copies of later batches are queued behind it
            x = torch.tanh(x @ weight)
        total += images.sum(dtype=torch.int64)
        if k >= n // 3:
            peaks.append(torch.cuda.memory_allocated())
    torch.cuda.synchronize()
    assert int(total) == int(data.sum(dtype=torch.int64))
    warm, late = max(peaks[: len(peaks) // 2]), max(peaks[len(peaks) // 2:])
    assert late <= warm + 4 * batch * 3 * 64 * 64, (warm, late)  # flat, give or take a few batches
    loader.close()
