"""The slot ledger: every arena slot is in exactly one state, whatever order tasks are
dispatched, claimed, answered, re-run after a worker death, handed out and dropped."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from gpufeed._engine.arena import Arena, SlotWriter, take_warm
from gpufeed._engine.ledger import SlotLedger

PAGE = mmap.PAGESIZE
SLOT = 4 * PAGE


def worker_writes(arena: Arena, slot: int, nbytes: int) -> None:
    """A worker writes ``nbytes`` of a batch into ``slot`` through its own mapping."""
    writer = SlotWriter(arena.handle())
    writer.begin(slot)
    region = writer.tensor((nbytes,), torch.uint8)
    assert region is not None
    region.fill_(7)
    writer.end()


@pytest.mark.parametrize("then", ["settle", "release"])
def test_a_fallback_a_dead_worker_wrote_never_returns_cold_with_its_pages(then):
    """A worker found no warm slot, wrote half of its task's fallback and died. The task is re-run
    and the new worker claims a warm slot: the fallback is then free, but it is not cold (it has
    pages), so it must not join the cold list, where nothing would ever give them back."""
    arena = Arena(SLOT, warm_cap=4)
    ledger = SlotLedger(arena, num_workers=1)
    key = (0, 0)
    fallback = ledger.take(key, 0)
    worker_writes(arena, fallback, SLOT // 2)
    ledger.drop_claim(key)  # the worker died: its replacement re-runs the task with this fallback
    spare = arena.acquire()  # a batch the user dropped meanwhile: a warm slot waits
    worker_writes(arena, spare, SLOT)
    arena.release(spare)
    warm = take_warm(arena.handle().warm_fd)  # the new worker takes it ...
    assert warm == spare
    ledger.claim(key, warm)  # ... tells the parent ...
    worker_writes(arena, warm, SLOT)  # ... and writes the batch there
    assert ledger.answered(key, 0)
    if then == "settle":
        ledger.settle(key)  # the reply: the batch is in the warm slot, the fallback is free
        in_use = SLOT
    else:
        ledger.release(key)  # the task was dropped (an abandoned epoch): both are free
        in_use = 0
    arena.trim_waiting()  # the parent waited for data: every free slot gives its pages back
    assert arena.resident_bytes() == in_use
    arena.close()


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


def _memfds() -> set[str]:
    """This process's open gpufeed memfd descriptors, as ``fd -> target`` lines."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd:gpufeed" in target:
            out.add(f"{fd} -> {target}")
    return out


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to list open memfds")
def test_an_iterator_whose_worker_shutdown_raised_still_lets_go_of_the_arena(monkeypatch):
    """A Ctrl-C that lands while the iterator joins its workers: the iterator must still detach
    from the arena, or closing the loader leaves the memfd open for the life of the process."""
    from gpufeed import FastLoader
    from gpufeed._engine.pool import WorkerPool

    before = _memfds()
    stop = WorkerPool._stop

    def interrupted_stop(self: WorkerPool, *args: object, **kwargs: object) -> object:
        stop(self, *args, **kwargs)
        raise KeyboardInterrupt("Ctrl-C while the workers were joined")

    loader = FastLoader(_Squares(), batch_size=4, num_workers=1)
    it = iter(loader)
    assert torch.equal(next(it)[0], torch.zeros(4))
    assert _memfds() - before  # the loader's arena (and a descriptor per mapped chunk)
    monkeypatch.setattr(WorkerPool, "_stop", interrupted_stop)
    with pytest.raises(KeyboardInterrupt):
        it.close()
    monkeypatch.undo()
    loader.close()
    assert _memfds() - before == set()
