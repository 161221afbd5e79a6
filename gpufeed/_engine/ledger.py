"""Which arena slots an iterator holds, so that each is freed exactly once."""

from __future__ import annotations

from gpufeed._engine.arena import Arena


class SlotLedger:
    """Which arena slots this iterator holds, so each is freed exactly once.

    ``held`` maps (epoch, task index) to the slot of every task that was dispatched and whose
    batch was neither handed to the user nor dropped; ``claims`` maps a task to the warm slot its
    worker took instead, until the reply settles it; ``unanswered[w]`` lists, oldest first, the
    tasks worker ``w`` still owes a reply (they are re-sent if it dies).
    """

    def __init__(self, arena: Arena, num_workers: int) -> None:
        self.arena = arena
        self.held: dict[tuple[int, int], int] = {}
        self.claims: dict[tuple[int, int], int] = {}
        self.unanswered: list[dict[tuple[int, int], None]] = [{} for _ in range(num_workers)]
        self.rerun: set[tuple[int, int]] = set()  # re-sent after a death: the fallback may be written

    def take(self, key: tuple[int, int], worker_id: int, warm: bool = False) -> int:
        slot = self.arena.acquire(warm)
        self.held[key] = slot
        self.unanswered[worker_id][key] = None
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
        if key in self.rerun:  # an earlier, dead worker may have written it: it has pages
            self.arena.release(slot)
        else:
            self.arena.release_cold(slot)

    def answered(self, key: tuple[int, int], worker_id: int) -> bool:
        """Mark answered; False if the task was not outstanding (e.g. already dropped)."""
        return self.unanswered[worker_id].pop(key, False) is None

    def release(self, key: tuple[int, int]) -> None:
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
        return self.held[key]

    def lease(self, key: tuple[int, int], nbytes: int) -> memoryview:
        self.rerun.discard(key)
        return self.arena.lease(self.held.pop(key), nbytes)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)
        for key in list(self.claims):
            self.drop_claim(key)
        for tasks in self.unanswered:
            tasks.clear()
        self.rerun.clear()
