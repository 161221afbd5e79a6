"""Where a serving mode's CPU goes: per-thread CPU milliseconds per answered request.

Runs ``serve.py``'s open-loop generator at one fixed offered rate against batch-1 handlers
and/or ``DynamicBatcher`` (same services as ``serve.py``), and reports for each run the CPU time
of every thread of this process (``pthread_getcpuclockid``) divided by the answered requests,
plus the busy cores of this process and of the whole host (another program taking a core shows
as host > ours). ``--trivial`` replaces decode + model by the identity: what is left is the
batcher's own cost (submit, future, scheduling, hand-off, results) and the generator's.

    python -m benchmarks.serve_threads [--rate 1000] [--duration 3] [--reps 2]
                                       [--modes batch-1 batcher] [--trivial] [--max-queue N]

Threads: ``MainThread`` is the load generator (and ``submit`` for the batcher),
``gpufeed-batcher`` the scheduler, ``gpufeed-batcher-model-N`` the model threads,
``bench-handler-N`` batch-1's handlers. Linux only (thread CPU clocks, /proc/stat).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import _serve_load as serve  # serve.py's services and generator
from benchmarks.serve_models import SPECS
from gpufeed.synth import make_image_folder  # noqa: E402


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds of a live thread; NaN when its clock cannot be read."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
    except (OSError, AttributeError):
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="offered requests per second (Poisson)")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of arrivals per run")
    p.add_argument("--reps", type=int, default=2, help="rounds; the modes alternate in each")
    p.add_argument("--modes", nargs="+", default=["batch-1", "batcher"], choices=["batch-1", "batcher"])
    p.add_argument("--trivial", action="store_true", help="identity preprocess and model")
    p.add_argument("--max-queue", type=int, default=16, help="the batcher's max_queue")
    p.add_argument("--max-latency-ms", type=float, default=None,
                   help="the batcher's max_latency_ms (0: no latency-aware admission; default: serve.py's, "
                   "0.6 x the 50 ms SLO)")
    p.add_argument("--cores", type=int, default=2)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpufeed-serve-threads-") as tmp:
        make_image_folder(tmp, num_classes=4, per_class=16)
        jpegs = [f.read_bytes() for f in sorted(Path(tmp).rglob("*.jpg"))]
    spec = SPECS["smallcnn"]
    pipe = serve.Pipeline(spec)
    if a.trivial:
        pipe.preprocess = lambda data: data  # type: ignore[method-assign,assignment,return-value]
        pipe.run = lambda inputs: inputs  # type: ignore[method-assign,assignment,return-value]
    args = argparse.Namespace(cores=a.cores, max_concurrent_batches=None, max_batch_size=None, max_delay_ms=None,
                              max_queue=a.max_queue, max_latency_ms=a.max_latency_ms, latency_budget=None,
                              capacity=0.0)
    print(f"smallcnn{' (trivial: identity preprocess and model)' if a.trivial else ''}, offered {a.rate:g}/s, "
          f"{a.duration:g} s per run, batcher max_queue={a.max_queue}, "
          f"max_latency_ms={serve.max_latency_ms(args, spec)}")
    for rep in range(a.reps):
        for mode in a.modes:
            service = serve.make_service(mode, pipe, spec, jpegs, args)
            before = {t.name: thread_cpu_s(t) for t in threading.enumerate()}
            host0, cpu0, t0 = serve.host_busy_s(), time.process_time(), time.perf_counter()
            offered, lat, refused, _ = serve.open_loop(service.send, lambda: None, jpegs, a.rate, a.duration,
                                                       10**6, 2.0, rep)
            wall = time.perf_counter() - t0
            host1, cpu1 = serve.host_busy_s(), time.process_time()
            after = {t.name: thread_cpu_s(t) for t in threading.enumerate()}
            mean_batch = service.mean_batch()
            service.close()
            n = max(1, len(lat))
            per = {k: 1000 * (v - before.get(k, 0.0)) / n for k, v in sorted(after.items())}
            per = {k: v for k, v in per.items() if v >= 0.0005}
            ms = np.asarray(lat) * 1000 if lat else np.asarray([np.nan])
            print(f"{mode:8} answered {len(lat)}/{offered} refused {refused} QPS {len(lat) / a.duration:.0f} "
                  f"p50 {np.percentile(ms, 50):.1f} ms p99 {np.percentile(ms, 99):.1f} ms batch {mean_batch:.2f}; "
                  f"cores busy: ours {(cpu1 - cpu0) / wall:.2f} host {(host1[0] - host0[0]) / wall:.2f}; "
                  f"CPU ms/request {sum(per.values()):.3f}: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
