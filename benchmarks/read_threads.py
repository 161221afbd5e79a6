"""The read-ahead's own CPU: ``ReadAhead`` alone, reads that sleep, one thread decoding.

One process, no loader: tasks of ``--batch`` samples are read ahead (``--concurrency`` reads in
flight, ``--hold`` tasks open at once, as a worker holds ``prefetch_factor`` tasks) by a read
function that sleeps ``--latency-ms`` and returns a JPEG, while this thread decodes each sample
in turn (OpenCV, one thread: a 224 px crop of a 400x350 photo, about 1 ms). Reported per image:
CPU of the whole process, of the decoding thread, and of the rest (the read threads); and the
same without reads (``--latency-ms 0``, read inline) in the same alternating rounds, so the
read-ahead's cost is the difference (median of rounds).

    python -m benchmarks.read_threads [--latency-ms 30] [--concurrency 64] [--rounds 5]

Private imports: ``gpufeed.image._reads`` (``BatchReads``, ``ReadAhead``: what it measures) and
``gpufeed._engine.threads.shutdown_pools`` (stops their threads between rounds, as a worker does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import cv2
import numpy as np

from benchmarks.latency import photo_jpegs
from gpufeed._engine.threads import shutdown_pools
from gpufeed.image._reads import BatchReads, ReadAhead


def run(items: list[bytes], latency_s: float, concurrency: int, tasks: int, batch: int,
        hold: int) -> tuple[float, float, float]:
    """(process CPU, decoding-thread CPU, wall) seconds per image."""
    out = np.empty((224, 224, 3), np.uint8)

    def decode(data: bytes) -> None:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        cv2.resize(img[10:300, 20:330], (224, 224), dst=out)

    def read(i: int) -> tuple[bytes, int]:
        if latency_s:
            time.sleep(latency_s)
        return items[i % len(items)], i % 10

    order = [list(range(k * batch, (k + 1) * batch)) for k in range(tasks)]
    c0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    if not latency_s:
        for task in order:
            for i in task:
                decode(read(i)[0])
    else:
        ahead = ReadAhead(concurrency, 64 << 20)
        begun: dict[int, BatchReads | None] = {}
        current = [0]

        def more() -> None:  # the tasks a worker holds: this one and hold - 1 after it
            for j in range(current[0], min(current[0] + hold, tasks)):
                if j not in begun:
                    begun[j] = None  # (batch() may ask for more again)
                    begun[j] = ahead.batch(read, order[j])

        ahead.more = more
        for k in range(tasks):
            current[0] = k
            more()
            reads = begun.pop(k)
            assert reads is not None
            try:
                for _ in order[k]:
                    decode(reads.next()[0])
            finally:
                reads.close()
        shutdown_pools()
    n = tasks * batch
    return ((time.process_time() - c0) / n, (time.thread_time() - m0) / n,
            (time.perf_counter() - t0) / n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hold", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    cv2.setNumThreads(1)
    items = photo_jpegs(256)
    runs: dict[str, list[tuple[float, float, float]]] = {"local": [], "reads": []}
    for _ in range(args.rounds):
        runs["local"].append(run(items, 0.0, 1, args.tasks, args.batch, args.hold))
        runs["reads"].append(run(items, args.latency_ms / 1e3, args.concurrency, args.tasks,
                                 args.batch, args.hold))
    us = 1e6
    local_cpu = statistics.median(r[0] for r in runs["local"])
    for name, rows in runs.items():
        cpu, main_cpu = (statistics.median(r[i] for r in rows) for i in (0, 1))
        rest = statistics.median(r[0] - r[1] for r in rows)
        label = ("no reads (inline, 0 ms)" if name == "local" else
                 f"{args.latency_ms:g} ms reads, {args.concurrency} in flight")
        print(f"{label:32s} CPU/image {cpu * us:6.0f} us (decoding thread {main_cpu * us:6.0f}, "
              f"read threads {rest * us:5.0f}), {cpu / local_cpu:.3f}x no reads; "
              f"{1 / statistics.median(r[2] for r in rows):5.0f} img/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
