"""The arena's slot life cycle: cold fallbacks, the warm pipe, surplus trimming, late binding."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from gpufeed._engine.arena import (
    TRIM_WINDOW,
    Arena,
    ArenaSnapshot,
    SlotWriter,
    take_warm,
)

SLOT = 16 * mmap.PAGESIZE


@pytest.fixture
def arena():
    a = Arena(SLOT, warm_cap=2)
    yield a
    a.close()


def write(arena: Arena, slot: int, nbytes: int = SLOT) -> None:
    arena.slot_tensor(slot)[:nbytes].fill_(7)


def test_acquire_gives_cold_slots_and_grows(arena):
    slots = [arena.acquire() for _ in range(5)]
    assert slots == [0, 1, 2, 3, 4] and arena.num_slots == 5
    assert arena.resident_bytes() == 0  # nothing written: no memory
    assert arena.warm_waiting() == 0


def test_a_freed_written_slot_waits_warm_and_is_taken_once(arena):
    slot = arena.acquire()
    write(arena, slot)
    arena.release(slot)
    assert arena.warm_waiting() == 1
    assert arena.resident_bytes() == SLOT  # warm: its pages stay
    assert take_warm(arena.handle().warm_fd) == slot
    assert take_warm(arena.handle().warm_fd) is None  # each id reaches one reader
    assert arena.warm_waiting() == 0


def test_acquire_warm_prefers_the_pipe_and_plain_acquire_never_takes_from_it(arena):
    a, b = arena.acquire(), arena.acquire()
    write(arena, a)
    arena.release(a)
    arena.release_cold(b)
    assert arena.acquire() == b  # cold first, the warm id stays for a worker
    assert arena.warm_waiting() == 1
    assert arena.acquire(warm=True) == a
    assert arena.acquire(warm=True) == 2  # nothing warm left: a new cold slot


def test_acquire_recent_takes_the_slot_freed_last_and_keeps_the_others_in_order():
    arena = Arena(SLOT, warm_cap=8)
    slots = [arena.acquire() for _ in range(4)]
    for slot in slots:
        write(arena, slot)
        arena.release(slot)
    assert arena.acquire_recent() == slots[-1]  # freed last: the likeliest to be in the CPU caches
    assert arena.snapshot().warm == tuple(slots[:-1])  # the others wait, oldest first
    assert arena.acquire_recent() == slots[-2]
    assert [arena.acquire_recent() for _ in range(2)] == [slots[1], slots[0]]
    assert arena.warm_waiting() == 0
    assert arena.acquire_recent() == 4  # nothing warm: as acquire(), a new cold slot
    assert arena.resident_bytes() == 4 * SLOT  # taking them emptied none
    arena.close()


def test_release_cold_never_enters_the_pipe(arena):
    slot = arena.acquire()
    arena.release_cold(slot)
    assert arena.warm_waiting() == 0 and arena.free_slots() == 1


def test_slots_beyond_warm_cap_give_their_pages_back(arena):
    slots = [arena.acquire() for _ in range(4)]
    for s in slots:
        write(arena, s)
    assert arena.resident_bytes() == 4 * SLOT
    for s in slots:
        arena.release(s)
    assert arena.warm_waiting() == 2  # warm_cap
    assert arena.emptied == 2
    assert arena.resident_bytes() == 2 * SLOT
    assert arena.free_slots() == 4


def test_a_warm_slot_that_always_waited_is_trimmed_once_per_window(arena):
    spare, cycling = arena.acquire(), arena.acquire()
    write(arena, spare)
    write(arena, cycling)
    arena.release(spare)  # waits in the pipe for ever: never needed
    fd = arena.handle().warm_fd
    for _ in range(TRIM_WINDOW):
        arena.release(cycling)
        taken = take_warm(fd)
        if taken == spare:  # FIFO: the spare comes out first, put it back behind
            arena.release(spare)
            taken = take_warm(fd)
        cycling = taken
    assert arena.emptied == 1
    assert arena.resident_bytes() == SLOT  # only the slot in use keeps its pages


def test_ids_that_waited_throughout_a_window_are_all_emptied_at_its_end():
    arena = Arena(SLOT, warm_cap=8)
    slots = [arena.acquire() for _ in range(4)]
    for s in slots:
        write(arena, s)
    for s in slots[:3]:
        arena.release(s)  # three spare ids
    fd = arena.handle().warm_fd
    in_use = slots[3]
    for _ in range(2 * TRIM_WINDOW):  # the consumer frees a batch, a worker takes an id
        arena.release(in_use)
        in_use = take_warm(fd)
        assert in_use is not None
    # Every release of the second window found 3 ids waiting: 3 were emptied at its end (the
    # one released then, and two from the pipe); only the slot in use keeps its pages.
    assert arena.emptied == 3 and arena.warm_waiting() == 0
    assert arena.resident_bytes() == SLOT
    arena.close()


def test_a_spare_that_a_worker_takes_before_each_free_keeps_its_pages(arena):
    """A worker that starts its next batch before the consumer frees the last one takes the
    spare: the spare is needed, trimming it would cost a refault per window."""
    spare, held = arena.acquire(), arena.acquire()
    write(arena, spare)
    write(arena, held)
    arena.release(spare)
    fd = arena.handle().warm_fd
    for _ in range(3 * TRIM_WINDOW):
        taken = take_warm(fd)  # the worker binds its next slot first...
        assert taken is not None
        arena.release(held)  # ...then the consumer frees its batch
        held = taken
    assert arena.emptied == 0 and arena.resident_bytes() == 2 * SLOT


def test_snapshot_says_where_free_and_leased_slots_are_and_leaves_the_pipe_as_it_was(arena):
    a, b, c, d = (arena.acquire() for _ in range(4))
    write(arena, a)
    write(arena, b, mmap.PAGESIZE)
    arena.release(a)
    arena.release(b)
    arena.release_cold(c)
    view = arena.lease(d, 64)
    assert arena.snapshot() == ArenaSnapshot(
        num_slots=4, cold=(c,), warm=(a, b), leased=(d,), pinned=frozenset()
    )
    fd = arena.handle().warm_fd
    assert (take_warm(fd), take_warm(fd), take_warm(fd)) == (a, b, None)  # still there, in order
    assert [arena.resident_bytes(s) for s in (a, b, c, d)] == [SLOT, mmap.PAGESIZE, 0, 0]
    del view
    assert arena.snapshot().leased == () and arena.snapshot().warm == (d,)


def test_surplus_pinned_slots_are_unpinned_before_their_pages_go(arena):
    slots = [arena.acquire() for _ in range(3)]
    unpinned = []
    arena.add_unpin_hook(lambda s: unpinned.append((s, arena.resident_bytes(s))))
    for s in slots:
        write(arena, s)
        arena.mark_pinned(s)
        arena.release(s)
    surplus = slots[arena.warm_cap:]  # released with warm_cap ids waiting
    assert arena.emptied == len(surplus) and arena.warm_waiting() == arena.warm_cap
    assert unpinned == [(s, SLOT) for s in surplus]  # unpinned while its pages were there
    assert arena.snapshot().pinned == set(slots[: arena.warm_cap])


def test_close_closes_the_pipe(arena):
    fd = arena.handle().warm_fd
    arena.close()
    with pytest.raises(OSError):
        take_warm(fd)


def test_late_binding_picks_the_slot_at_the_first_write_only(arena):
    for _ in range(2):
        arena.acquire()
    writer = SlotWriter(arena.handle())
    picks = []

    def pick() -> int:
        picks.append(1)
        return 1

    writer.begin_late(pick)
    assert writer.active and picks == []
    writer.seek(0)
    writer.mark(0, 8)
    assert picks == []  # layout bookkeeping does not bind
    t = writer.tensor((4,), torch.int64)
    assert picks == [1] and t is not None
    t.fill_(5)
    writer.end()
    assert torch.equal(arena.slot_tensor(1)[:32].view(torch.int64), torch.full((4,), 5))
    assert torch.equal(arena.slot_tensor(0)[:32], torch.zeros(32, dtype=torch.uint8))


def test_late_binding_without_writes_never_picks(arena):
    arena.acquire()
    writer = SlotWriter(arena.handle())
    writer.begin_late(lambda: pytest.fail("bound a slot nobody wrote"))
    assert writer.alloc(SLOT + 1) is None  # too big: falls back to pickling, binds nothing
    writer.end()
    assert not writer.active


def test_a_worker_waits_briefly_for_the_slot_the_consumer_is_about_to_free(arena):
    import multiprocessing
    import threading
    import time

    from gpufeed._engine.messages import Claim
    from gpufeed._engine.worker import _pick_slot

    fallback, warm = arena.acquire(), arena.acquire()
    write(arena, warm)
    theirs, ours = multiprocessing.Pipe(duplex=False)
    timer = threading.Timer(0.02, arena.release, args=(warm,))
    timer.start()
    got = _pick_slot(arena.handle().warm_fd, ours, 0, 7, fallback, wait_s=60.0)  # returns at the release
    timer.join()
    assert got == warm
    assert theirs.recv() == Claim(epoch=0, idx=7, slot=warm)  # the parent is told before the slot is written
    t0 = time.monotonic()
    assert _pick_slot(arena.handle().warm_fd, ours, 0, 8, fallback, wait_s=0.05) == fallback
    assert 0.04 <= time.monotonic() - t0 < 60.0  # waited its 50 ms (the upper bound: a hang guard only)
    assert not theirs.poll()  # no claim for a fallback


def test_trim_waiting_empties_waiting_warm_slots_unpinning_pinned_ones_first(arena):
    a, b, c = (arena.acquire() for _ in range(3))
    for s in (a, b, c):
        write(arena, s)
    arena.mark_pinned(c)
    unpinned = []
    arena.add_unpin_hook(lambda s: unpinned.append((s, arena.resident_bytes(s))))
    arena.release(a)
    arena.release(c)
    assert arena.trim_waiting() == 2
    assert arena.emptied == 2 and arena.warm_waiting() == 0
    assert unpinned == [(c, SLOT)] and arena.snapshot().pinned == frozenset()
    assert arena.resident_bytes() == SLOT  # b, in use
    assert arena.free_slots() == 2


@pytest.mark.timeout(30)
def test_a_batch_dropped_in_a_forked_child_stays_held_by_the_parent(arena):
    """A forked child has copies of the parent's batches; when one dies there (``del``, or the
    weakref finalizers run at a normal exit), its slot must not reach the pipe the parent shares
    with its workers: the parent still holds the batch, and a worker would write over it."""
    slot = arena.acquire()
    write(arena, slot)
    view = arena.lease(slot, 64)
    pid = os.fork()
    if pid == 0:
        try:
            del view  # the child's copy of the lease dies and its finalizer runs here
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert arena.warm_waiting() == 0 and arena.free_slots() == 0
    del view  # the parent's own batch dies: now the slot is free
    assert take_warm(arena.handle().warm_fd) == slot


def test_a_worker_waits_for_a_warm_slot_on_a_descriptor_above_1023(arena):
    """select() cannot watch descriptors >= FD_SETSIZE (1024): a process with many files open
    (and its forked workers) has the warm pipe up there."""
    import fcntl
    import multiprocessing
    import resource

    from gpufeed._engine.messages import Claim
    from gpufeed._engine.worker import _pick_slot

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2048), hard))
    high = fcntl.fcntl(arena.handle().warm_fd, fcntl.F_DUPFD, 1024)
    try:
        fallback = arena.acquire()
        theirs, ours = multiprocessing.Pipe(duplex=False)
        assert _pick_slot(high, ours, 0, 1, fallback, wait_s=0.01) == fallback
        warm = arena.acquire()
        write(arena, warm)
        arena.release(warm)
        assert _pick_slot(high, ours, 0, 2, fallback, wait_s=0.01) == warm
        assert theirs.recv() == Claim(epoch=0, idx=2, slot=warm)
    finally:
        os.close(high)


@pytest.mark.parametrize("op", ["release", "trim_waiting"])
def test_a_collection_inside_the_arena_lock_that_frees_a_batch_does_not_deadlock(monkeypatch, op):
    """A garbage collection can run at any allocation, also one made while the arena's lock is
    held; if it frees a batch in a reference cycle, the batch's finalizer releases its slot in
    that same thread."""
    import gc
    import threading

    import gpufeed._engine.arena as arena_module

    arena = Arena(SLOT, warm_cap=1)
    held, other, waiting = arena.acquire(), arena.acquire(), arena.acquire()
    arena.release(waiting)  # one id waits: the next release is surplus and empties its slot
    if op == "trim_waiting":
        arena.release(other)

    class Batch:
        pass

    batch = Batch()
    batch.cycle, batch.view = batch, arena.lease(held, 64)
    del batch  # garbage only a collection finds
    chunk_of = arena_module.chunk_of

    def chunk_of_collecting(slot: int):
        gc.collect()  # the collection an allocation in the locked region happened to trigger
        return chunk_of(slot)

    monkeypatch.setattr(arena_module, "chunk_of", chunk_of_collecting)
    run = (lambda: arena.release(other)) if op == "release" else arena.trim_waiting
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "deadlocked on the arena's own lock"
    monkeypatch.undo()
    assert arena.free_slots() == 3
    arena.close()
