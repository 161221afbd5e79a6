"""The slot ledger: every arena slot is in exactly one state, whatever order tasks are
dispatched, claimed, answered, re-run after a worker death, handed out and dropped."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpufeed._engine.arena import Arena, SlotWriter, take_warm
from gpufeed._engine.ledger import SlotLedger, SlotState

PAGE = mmap.PAGESIZE
SLOT = 4 * PAGE


@pytest.fixture
def arena():
    a = Arena(SLOT, warm_cap=4)
    yield a
    a.close()


def write_as_worker(arena: Arena, slot: int, nbytes: int) -> None:
    """A worker writes ``nbytes`` of a batch into ``slot`` through its own mapping."""
    writer = SlotWriter(arena.handle())
    writer.begin(slot)
    region = writer.tensor((nbytes,), torch.uint8)
    assert region is not None
    region.fill_(7)
    writer.end()


@pytest.mark.parametrize("then", ["settle", "release"])
def test_a_fallback_a_dead_worker_wrote_never_returns_cold_with_its_pages(arena, then):
    """A worker found no warm slot, wrote half of its task's fallback and died. The task is re-run
    and the new worker claims a warm slot: the fallback is then free, but it is not cold (it has
    pages), so it must not join the cold list, where nothing would ever give them back."""
    ledger = SlotLedger(arena, num_workers=1)
    key = (0, 0)
    fallback = ledger.take(key, 0)
    write_as_worker(arena, fallback, SLOT // 2)
    ledger.drop_claim(key)  # the worker died: its replacement re-runs the task with this fallback
    spare = arena.acquire()  # a batch the user dropped meanwhile: a warm slot waits
    write_as_worker(arena, spare, SLOT)
    arena.release(spare)
    warm = take_warm(arena.handle().warm_fd)  # the new worker takes it ...
    assert warm == spare
    ledger.claim(key, warm)  # ... tells the parent ...
    write_as_worker(arena, warm, SLOT)  # ... and writes the batch there
    assert ledger.answered(key, 0)
    if then == "settle":
        ledger.settle(key)  # the reply: the batch is in the warm slot, the fallback is free
        in_use = SLOT
    else:
        ledger.release(key)  # the task was dropped (an abandoned epoch): both are free
        in_use = 0
    arena.trim_waiting()  # the parent waited for data: every free slot gives its pages back
    assert arena.resident_bytes() == in_use


# -- the state machine ----------------------------------------------------------------------
# Random sequences of what an iterator, its workers and the user do to the slots, on a real
# memfd arena; after every step each slot must be in exactly one state. Derandomized: the same
# examples run on every machine (hypothesis derives them from the test's name).

NUM_WORKERS = 2
WORKERS = range(NUM_WORKERS)
MAX_TASKS = 6  # tasks in flight at once (prefetch_factor * num_workers in a loader)
EPOCH_TASKS = 8  # tasks dispatched before a shutdown may come


@dataclass
class Task:
    """What the test knows of one dispatched task."""

    worker: int
    slot: int  # the slot the ledger holds for it: the fallback, then where the batch is
    swap: bool  # the worker may take a warm slot (False: the parent wrote the fallback)
    value: int  # the byte its worker writes
    bound: int | None = None  # the slot the current run writes, once it wrote
    claim_on_its_way: bool = False  # bound to a warm id; the claim has not reached the parent
    claimed: int | None = None
    answered: bool = False
    nbytes: int = 0


def _answered(t: Task) -> bool:
    return t.answered


def _can_write(t: Task) -> bool:
    return t.bound is None and not t.answered


def _can_reply(t: Task) -> bool:
    return not t.answered and not t.claim_on_its_way  # a reply follows its claim on one pipe


def _writing(t: Task) -> bool:
    return not t.answered and t.bound is not None


def _droppable(t: Task) -> bool:
    return t.answered or t.bound is not None  # (dropping tasks nobody started adds nothing)


class SlotLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.arena = Arena(SLOT, warm_cap=2)
        self.ledger = SlotLedger(self.arena, NUM_WORKERS)
        self.writer = SlotWriter(self.arena.handle())  # the workers' own mapping of the memfd
        self.warm_fd = self.arena.handle().warm_fd
        self.epoch, self.next_idx = 0, 0
        self.tasks: dict[tuple[int, int], Task] = {}  # in the ledger: neither leased nor dropped
        # A dropped task's (worker, warm id) whose claim is still on its way:
        self.orphans: dict[tuple[int, int], tuple[int, int]] = {}
        self.leases: list[tuple[int, memoryview]] = []  # batches the user holds
        self.pinned: dict[int, int] = {}  # page-locked slot -> its resident bytes then
        self.arena.add_unpin_hook(self._unpinned)

    def _unpinned(self, slot: int) -> None:
        """The arena is about to empty a page-locked slot: its pages are all still there."""
        assert self.arena.resident_bytes(slot) >= self.pinned.pop(slot), f"slot {slot} lost pages while locked"

    def teardown(self) -> None:
        self.leases.clear()
        self.arena.close()

    def _any(self, which: Callable[[Task], bool]) -> bool:
        return any(which(t) for t in self.tasks.values())

    def _pick(self, data: st.DataObject, which: Callable[[Task], bool]) -> tuple[int, int]:
        return data.draw(st.sampled_from(sorted(k for k, t in self.tasks.items() if which(t))))

    def _write(self, slot: int, nbytes: int, value: int) -> None:
        self.writer.begin(slot)
        region = self.writer.tensor((nbytes,), torch.uint8)
        assert region is not None
        region.fill_(value)
        self.writer.end()

    # -- the iterator and its workers --------------------------------------------------------
    @precondition(lambda self: len(self.tasks) < MAX_TASKS)
    @rule(worker=st.sampled_from(WORKERS), parent_binds=st.sampled_from([False] * 3 + [True]))
    def dispatch(self, worker: int, parent_binds: bool) -> None:
        """take: a cold fallback; with a cache the parent takes a warm slot and writes hits."""
        key = (self.epoch, self.next_idx)
        self.next_idx += 1
        slot = self.ledger.take(key, worker, warm=parent_binds)
        value = 1 + self.next_idx % 250
        if parent_binds:
            self._write(slot, PAGE, value)
        self.tasks[key] = Task(worker, slot, swap=not parent_binds, value=value)

    @precondition(lambda self: self._any(_can_write))
    @rule(data=st.data(), nbytes=st.integers(1, SLOT))
    def worker_writes(self, data: st.DataObject, nbytes: int) -> None:
        """A worker binds its slot at its first write: a warm id from the pipe, else the
        fallback."""
        task = self.tasks[self._pick(data, _can_write)]
        warm = take_warm(self.warm_fd) if task.swap else None
        task.bound = task.slot if warm is None else warm
        task.claim_on_its_way = warm is not None
        task.nbytes = nbytes
        self._write(task.bound, nbytes, task.value)

    @precondition(lambda self: self.orphans or self._any(lambda t: t.claim_on_its_way))
    @rule(data=st.data())
    def claim_arrives(self, data: st.DataObject) -> None:
        keys = sorted(k for k, t in self.tasks.items() if t.claim_on_its_way) + sorted(self.orphans)
        key = data.draw(st.sampled_from(keys))
        if key in self.orphans:
            self.ledger.claim(key, self.orphans.pop(key)[1])  # the task was dropped: frees it
        else:
            task = self.tasks[key]
            assert task.bound is not None
            self.ledger.claim(key, task.bound)
            task.claimed, task.claim_on_its_way = task.bound, False

    @precondition(lambda self: self._any(_can_reply))
    @rule(data=st.data())
    def reply_arrives(self, data: st.DataObject) -> None:
        """settle; a task that wrote nothing may reply too (an error)."""
        key = self._pick(data, _can_reply)
        task = self.tasks[key]
        assert self.ledger.answered(key, task.worker)
        self.ledger.settle(key)
        task.answered = True
        if task.claimed is not None:
            task.slot, task.claimed = task.claimed, None
        if task.bound is None:
            task.nbytes = 0
        assert self.ledger.slot(key) == task.slot

    @precondition(lambda self: self._any(_writing))
    @rule(data=st.data())
    def worker_dies(self, data: st.DataObject) -> None:
        """A worker dies while writing: its messages are drained first (claims arrive), then
        drop_claim and re-run of every task it owed."""
        worker = self.tasks[self._pick(data, _writing)].worker
        for key, task in self.tasks.items():
            if task.worker == worker and task.claim_on_its_way:
                assert task.bound is not None
                self.ledger.claim(key, task.bound)
                task.claimed, task.claim_on_its_way = task.bound, False
        for key in [k for k, (w, _) in self.orphans.items() if w == worker]:
            self.ledger.claim(key, self.orphans.pop(key)[1])
        for key in sorted(self.ledger.unanswered[worker]):
            task = self.tasks[key]
            self.ledger.drop_claim(key)
            task.claimed, task.bound, task.nbytes = None, None, 0  # re-sent with its fallback

    @precondition(lambda self: self._any(_droppable))
    @rule(data=st.data())
    def drop_task(self, data: st.DataObject) -> None:
        """release: an answered batch nobody will look at, or a task whose worker ended."""
        key = self._pick(data, _droppable)
        task = self.tasks.pop(key)
        self.ledger.answered(key, task.worker)
        self.ledger.release(key)
        if task.claim_on_its_way:
            assert task.bound is not None
            self.orphans[key] = (task.worker, task.bound)

    @precondition(lambda self: self.next_idx >= EPOCH_TASKS)
    @rule()
    def shutdown(self) -> None:
        """The pool stopped: claims left in the pipes arrive, then release_all."""
        for key, task in self.tasks.items():
            if task.claim_on_its_way:
                assert task.bound is not None
                self.ledger.claim(key, task.bound)
        for key, (_, slot) in self.orphans.items():
            self.ledger.claim(key, slot)
        self.ledger.release_all()
        self.tasks.clear()
        self.orphans.clear()
        self.epoch, self.next_idx = self.epoch + 1, 0

    @precondition(lambda self: self.arena.warm_waiting() > 0 and not self._any(_answered))
    @rule()
    def consumer_waits(self) -> None:
        """The parent waited for data (none is ready): warm slots waiting are surplus."""
        self.arena.trim_waiting()

    # -- the user ----------------------------------------------------------------------------
    @precondition(lambda self: self._any(_answered))
    @rule(data=st.data(), pin=st.booleans())
    def hand_out(self, data: st.DataObject, pin: bool) -> None:
        """lease, page-locking the slot first as the CUDA feed's registrar does."""
        key = self._pick(data, _answered)
        task = self.tasks.pop(key)
        if pin:
            self.arena.mark_pinned(task.slot)
            self.pinned.setdefault(task.slot, self.arena.resident_bytes(task.slot))
        view = self.ledger.lease(key, task.nbytes)
        assert bytes(view[: task.nbytes]) == bytes([task.value]) * task.nbytes  # the batch it wrote
        self.leases.append((task.slot, view))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def user_drops_a_batch(self, data: st.DataObject) -> None:
        """The lease's last view dies: the slot is free."""
        self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))

    # -- what must hold after every step -----------------------------------------------------
    @invariant()
    def every_slot_is_in_exactly_one_state(self) -> None:
        states: dict[int, list[object]] = dict(self.ledger.slot_states())
        in_workers = [t.bound for t in self.tasks.values() if t.claim_on_its_way]
        in_workers += [slot for _, slot in self.orphans.values()]
        for slot in in_workers:
            assert slot is not None
            states[slot].append("taken from the pipe by a worker, claim on its way")
        wrong = {slot: found for slot, found in states.items() if len(found) != 1}
        assert not wrong, f"slots not in exactly one state: {wrong}"

        def having(state: SlotState) -> list[int]:
            return sorted(slot for slot, found in states.items() if found == [state])

        assert having(SlotState.HELD) == sorted(t.slot for t in self.tasks.values())
        claimed = sorted(t.claimed for t in self.tasks.values() if t.claimed is not None)
        assert having(SlotState.CLAIMED) == claimed
        assert having(SlotState.LEASED) == sorted(slot for slot, _ in self.leases)
        for slot in having(SlotState.COLD):
            assert self.arena.resident_bytes(slot) == 0, f"cold slot {slot} has pages"
        snap = self.arena.snapshot()
        assert not set(having(SlotState.COLD)) & snap.pinned  # emptying unpins first
        assert snap.pinned == set(self.pinned)
        for slot, nbytes in self.pinned.items():  # page-locked pages stay until it is unpinned
            assert self.arena.resident_bytes(slot) >= nbytes, f"page-locked slot {slot} lost pages"
        owed = [
            {k for k, t in self.tasks.items() if t.worker == w and not t.answered}
            for w in WORKERS
        ]
        assert [set(keys) for keys in self.ledger.unanswered] == owed


SlotLifecycle.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# A failure is shrunk by replaying thousands of sequences: minutes on a loaded machine.
test_slot_lifecycle = pytest.mark.timeout(600)(SlotLifecycle.TestCase)
