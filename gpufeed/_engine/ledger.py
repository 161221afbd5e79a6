"""Which arena slots an iterator holds, so that each is freed exactly once.

Every slot of an arena is, at any moment, in exactly one of these states (``SlotState``):

free, kept by the ``Arena``:
    cold         on the cold list, no pages: never written, or emptied (MADV_REMOVE).
    warm         its id waits in the warm pipe; usually with pages (a worker wrote it before).
in use, recorded here:
    held         the slot of a dispatched task: its fallback until the reply settles it, then
                 the slot its batch is in.
    claimed      a warm slot a worker took for a task instead of the fallback.
    leased       a batch handed to the user, free when its last view dies.
Between a worker taking a warm id from the pipe and its claim reaching the parent, the slot has
no state here: only that worker knows it (a death in that instant strands it).
Page-locked slots are used only by the CUDA feed, which holds host batches until their copies
completed, so a released slot is never still being read. Page-locking is not a state: a warm,
held, claimed or leased slot may be page-locked; a cold one never is (emptying unpins first).

The verbs that move a slot:
    take         cold -> held; with ``warm=True`` warm -> held (the parent writes it itself)
    bind         warm (the one freed last), else cold -> held: a task the parent completes as it
                 hands it out
    claim        (taken from the pipe by a worker) -> claimed; -> free if the task was dropped
    settle       the reply came: claimed -> held, and the unused fallback held -> cold
    drop_claim   the worker died: claimed -> free; the task is re-sent with its fallback
    lease        held -> leased; -> free when the batch's last view dies
    release      a dropped task: held and claimed -> free; ``release_all`` frees every task's
    free         (``Arena.release``) -> warm, or -> cold, emptied, when surplus (a page-locked
                 slot is unpinned, then emptied)
    trim         (``Arena.trim_waiting``) warm -> cold, emptied (page-locked ones unpinned first)
A fallback a dead worker may have written has pages: it is freed as written (warm or emptied),
never put back on the cold list as it is.
"""

from __future__ import annotations

import enum

from gpufeed._engine.arena import Arena


class SlotState(enum.Enum):
    """The state of an arena slot (defined in the module docstring)."""

    COLD = "cold"
    WARM = "warm"
    HELD = "held"
    CLAIMED = "claimed"
    LEASED = "leased"


class SlotLedger:
    """The slots of one iterator's tasks, keyed by (epoch, task index).

    ``held`` maps every dispatched task whose batch was neither handed to the user nor dropped to
    its slot; ``claims`` maps a task to the warm slot its worker took instead, until the reply
    settles it; ``unanswered[w]`` lists, oldest first, the tasks worker ``w`` still owes a reply
    (they are re-sent if it dies); ``rerun`` holds the tasks re-sent after a death whose dead
    worker wrote no claimed slot, so it may have written their fallback.
    """

    def __init__(self, arena: Arena, num_workers: int) -> None:
        self.arena = arena
        self.held: dict[tuple[int, int], int] = {}
        self.claims: dict[tuple[int, int], int] = {}
        self.unanswered: list[dict[tuple[int, int], None]] = [{} for _ in range(num_workers)]
        self.rerun: set[tuple[int, int]] = set()

    def take(self, key: tuple[int, int], worker_id: int, warm: bool = False) -> int:
        """Dispatch: a cold fallback slot for the task (with ``warm``, a warm one if waiting)."""
        slot = self.arena.acquire(warm)
        self.held[key] = slot
        self.unanswered[worker_id][key] = None
        return slot

    def bind(self, key: tuple[int, int]) -> int:
        """A task the parent completes as it hands it out: the warm slot freed last if one
        waits, else a cold one; no worker owes the task."""
        slot = self.held[key] = self.arena.acquire_recent()
        return slot

    def claim(self, key: tuple[int, int], slot: int) -> None:
        """The task's worker writes warm ``slot`` instead of the fallback."""
        if key in self.held:
            self.claims[key] = slot
        else:  # the task was dropped meanwhile: nobody will read the slot
            self.arena.release(slot)

    def settle(self, key: tuple[int, int]) -> None:
        """The task was answered: its batch lives in the claimed slot, if any."""
        slot = self.claims.pop(key, None)
        if slot is not None:
            self._free_fallback(key, self.held[key])
            self.held[key] = slot
        self.rerun.discard(key)

    def drop_claim(self, key: tuple[int, int]) -> None:
        """The task's worker died: free the warm slot it took (the task is re-sent)."""
        slot = self.claims.pop(key, None)
        if slot is not None:
            self.arena.release(slot)
        elif key in self.held:  # it bound no warm slot, so it may have written the fallback
            self.rerun.add(key)

    def _free_fallback(self, key: tuple[int, int], slot: int) -> None:
        """Free a task's fallback that its worker did not use (it wrote a claimed slot)."""
        if key in self.rerun:
            self.arena.release(slot)
        else:
            self.arena.release_cold(slot)

    def answered(self, key: tuple[int, int], worker_id: int) -> bool:
        """Mark answered; False if the task was not outstanding (e.g. already dropped)."""
        return self.unanswered[worker_id].pop(key, False) is None

    def release(self, key: tuple[int, int]) -> None:
        """The task is dropped: free its slots (unknown keys are ignored)."""
        slot = self.held.pop(key, None)
        claimed = self.claims.pop(key, None)
        if claimed is not None:
            self.arena.release(claimed)
            if slot is not None:
                self._free_fallback(key, slot)
        elif slot is not None:
            self.arena.release(slot)
        self.rerun.discard(key)

    def slot(self, key: tuple[int, int]) -> int:
        """The slot the task's batch is in (after ``settle``)."""
        return self.held[key]

    def lease(self, key: tuple[int, int], nbytes: int) -> memoryview:
        """Hand the task's batch to the user: a view of its first ``nbytes``; the slot is freed
        when the view's last user dies."""
        self.rerun.discard(key)
        return self.arena.lease(self.held.pop(key), nbytes)

    def release_all(self) -> None:
        """Free every slot of every task (shutdown: no worker writes any more)."""
        for key in list(self.held):
            self.release(key)
        for key in list(self.claims):
            self.drop_claim(key)
        for tasks in self.unanswered:
            tasks.clear()
        self.rerun.clear()

    def slot_states(self) -> dict[int, list[SlotState]]:
        """Every slot of the arena with the states it is found in: exactly one each, but none
        for a warm id a worker took and has not claimed yet, or for slots other iterators of
        the same arena hold. For tests and diagnostics: it reads the warm pipe
        (``Arena.snapshot``)."""
        snap = self.arena.snapshot()
        states: dict[int, list[SlotState]] = {slot: [] for slot in range(snap.num_slots)}
        found = (
            (SlotState.WARM, snap.warm),
            (SlotState.LEASED, snap.leased),
            (SlotState.HELD, self.held.values()),
            (SlotState.CLAIMED, self.claims.values()),
        )
        for slot in snap.cold:
            states[slot].append(SlotState.COLD)
        for state, slots in found:
            for slot in slots:
                states[slot].append(state)
        return states
