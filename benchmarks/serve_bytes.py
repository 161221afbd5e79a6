"""How ImageBatcher's request bytes reach a worker: pickled in the task vs copied into the slot.

Per batch of N encoded images of S bytes, the time from the parent starting to send a task to
the parent reading the worker's (tiny) answer, two ways:

* **pipe**: the payloads travel in the ``Task`` (pickled, written through the task pipe, whose
  buffer is grown to 1 MiB as the engine does, read and unpickled by the worker);
* **slot**: the parent copies the payloads into an arena slot (what ``RequestFeed.prepare``
  does) and sends a ``Task`` with (position, offset, nbytes) only.

The worker only counts the bytes it got (decoding them costs the same either way).

    python -m benchmarks.serve_bytes [--reps 200]

Private imports: ``gpufeed._engine.arena.Arena``, ``gpufeed._engine.messages.Task`` and
``gpufeed._engine.pool._grow_pipe``: the slot, the task and the pipe it measures.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection

from gpufeed._engine.arena import Arena
from gpufeed._engine.messages import Task
from gpufeed._engine.pool import _grow_pipe


def _worker(tasks: Connection, replies: Connection) -> None:
    while True:
        task = tasks.recv()
        if task is None:
            return
        replies.send(sum(len(d) for d in task.extra) if isinstance(task.extra, list) else len(task.extra))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    ctx = mp.get_context("fork")
    task_r, task_w = ctx.Pipe(duplex=False)
    reply_r, reply_w = ctx.Pipe(duplex=False)
    _grow_pipe(task_w)
    _grow_pipe(reply_w)
    proc = ctx.Process(target=_worker, args=(task_r, reply_w), daemon=True)
    proc.start()
    arena = Arena(64 << 20)
    slot = arena.acquire()
    buf = arena.slot_tensor(slot)
    try:
        for size, n in ((40_000, 8), (40_000, 32), (200_000, 32)):
            payloads = [os.urandom(size) for _ in range(n)]
            best: dict[str, list[float]] = {"pipe": [], "slot": []}
            for mode in ("pipe", "slot") * 3:  # alternating rounds
                t0 = time.perf_counter()
                for i in range(args.reps):
                    if mode == "pipe":
                        task_w.send(Task(0, i, slot, list(range(n)), payloads, False))
                    else:
                        cursor, given = 0, []
                        for pos, data in enumerate(payloads):
                            view = memoryview(data)
                            buf[cursor : cursor + view.nbytes].numpy()[:] = view
                            given.append((pos, cursor, view.nbytes))
                            cursor += view.nbytes
                        task_w.send(Task(0, i, slot, list(range(n)), tuple(given), False))
                    reply_r.recv()
                best[mode].append((time.perf_counter() - t0) / args.reps)
            pipe_s, slot_s = sorted(best["pipe"])[1], sorted(best["slot"])[1]  # median of 3 rounds
            print(f"{n:3d} x {size // 1000:3d} KB: pipe {pipe_s * 1e3:7.2f} ms, slot {slot_s * 1e3:6.2f} ms per batch "
                  f"-> slot {pipe_s / slot_s:.1f}x faster")
    finally:
        task_w.send(None)
        proc.join(10)
        arena.close()


if __name__ == "__main__":
    main()
