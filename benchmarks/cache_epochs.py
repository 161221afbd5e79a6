"""Cached epochs under default settings: a cold epoch against fully cached ones.

    PYTHONPATH=CHECKOUT python -m benchmarks.cache_epochs [ROOT] [--images 1500] [--size 96 128]
        [--epochs 3] [--workers 2] [--batch-size 64] [--outputs uint8 float32] [--hold]

``cache_bytes`` holds the whole set and ``persistent_workers`` is left False (the default), so
every epoch builds its iterator again. For each output (uint8, float32 normalized) the script
times one cold epoch and ``--epochs`` cached ones (each from ``iter()`` to the last batch, so
worker start-up counts; each batch released before the next is asked for, as a consumer that
copies it to a GPU does, or with ``--hold`` held until the next one arrives), and reports,
measured in the same run:

* cached / cold speed (goal: >= 10x without persistent workers);
* the cached epochs' batch bytes/s (image tensors only) against this machine's single-thread
  memcpy bandwidth (``numpy.copyto`` of a 256 MiB buffer, best of 5, measured right before each
  cached epoch so both see the same load; the median of the per-epoch ratios; goal for uint8:
  >= 50%), and the same bytes per second of main-process CPU (what the parent's code does when
  it has a core);
* the main process's CPU seconds per batch (``time.process_time``), cold and cached, and the
  batches the main process completed itself (``stats()["parent_batches"]``).

Without ROOT, a demo folder of ``--images`` JPEGs of ``--size`` px (min max) is generated in a
temporary directory. Eval transform ResizeCenterCrop(224, 256). For A/B runs of
two checkouts, alternate them on the same ROOT and compare the ratios, not the timings.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import gpufeed
from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.synth import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OUTPUTS = {"uint8": {}, "float32": {"normalize": (MEAN, STD)}}


def memcpy_bytes_per_s(nbytes: int = 256 << 20, rounds: int = 5) -> float:
    """Single-thread memcpy bandwidth: numpy copy of a large buffer into another (best of 5)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def run_epoch(loader: FastLoader, hold: bool = False) -> tuple[float, float, int, int]:
    """(wall s, main-process CPU s, batches, image bytes) of one epoch from iter().

    The batch is released before the next one is asked for, as a consumer that copies it to a
    GPU (``x, y = x.cuda(), y.cuda()``) does; with ``hold``, it is held until the next one
    arrives (``for x, y in loader`` with no rebinding of the names)."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    batches = nbytes = 0
    for images, labels in loader:
        batches += 1
        nbytes += images.numel() * images.element_size()
        if not hold:
            del images, labels  # both view the batch's slot: it is free once both are gone
    return time.perf_counter() - t0, time.process_time() - c0, batches, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", help="image folder (default: a generated demo folder)")
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--size", type=int, nargs=2, default=(96, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--epochs", type=int, default=3, help="cached epochs (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--outputs", nargs="+", default=list(OUTPUTS), choices=list(OUTPUTS))
    parser.add_argument("--memcpy-mb", type=int, default=256,
                        help="buffer of the memcpy reference (MiB; larger than the last-level cache)")
    parser.add_argument("--hold", action="store_true",
                        help="hold each batch until the next one arrives (default: release it first)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root
        if root is None:
            root = os.path.join(tmp, "demo")
            per_class = max(1, args.images // 10)
            lo, hi = args.size
            make_image_folder(root, num_classes=10, per_class=per_class, size=((lo, hi), (lo, hi)), seed=0)
        dataset = ImageFolder(root, transform=ResizeCenterCrop(224, 256))
        out = sys.stdout
        cpu = platform.processor() or platform.machine()
        out.write(f"gpufeed {gpufeed.__file__} | torch {torch.__version__} | {cpu} "
                  f"| {os.cpu_count()} cpus | {len(dataset)} images | batch {args.batch_size} | "
                  f"{args.workers} workers | persistent_workers=False | "
                  f"{'batch held until the next' if args.hold else 'batch released before the next'}\n")
        memcpy = [memcpy_bytes_per_s(args.memcpy_mb << 20)]
        for name in args.outputs:
            loader = FastLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                cache_bytes="60%", seed=0, **OUTPUTS[name])
            cold_s, cold_cpu, batches, nbytes = run_epoch(loader, args.hold)
            cached, ratios = [], []
            for _ in range(args.epochs):  # memcpy right before each epoch: the same load on the box
                memcpy.append(memcpy_bytes_per_s(args.memcpy_mb << 20))
                cached.append(run_epoch(loader, args.hold))
                ratios.append(nbytes / cached[-1][0] / memcpy[-1])
            stats = loader.stats()
            loader.close()
            warm_s = statistics.median(c[0] for c in cached)
            warm_cpu = statistics.median(c[1] for c in cached)
            rate = nbytes / warm_s
            bw = statistics.median(memcpy)
            out.write(
                f"{name:8s} cold {cold_s:.3f} s | cached {warm_s:.4f} s (epochs: "
                f"{', '.join(f'{c[0]:.4f}' for c in cached)}) | cached/cold {cold_s / warm_s:.1f}x "
                f"(goal >= 10x)\n"
                f"{'':8s} cached batch data {rate / 1e9:.2f} GB/s = {statistics.median(ratios):.0%} of "
                f"single-thread memcpy {bw / 1e9:.2f} GB/s (median of per-epoch ratios: "
                f"{', '.join(f'{r:.0%}' for r in ratios)})" + (" (goal >= 50%)" if name == "uint8" else "") +
                f"; per main-process CPU second {nbytes / warm_cpu / 1e9:.2f} GB/s = "
                f"{nbytes / warm_cpu / bw:.0%} (wall includes time the main process did not get a core)\n"
                f"{'':8s} main-process CPU per batch: cold {cold_cpu / batches * 1e3:.2f} ms, cached "
                f"{warm_cpu / batches * 1e3:.2f} ms ({nbytes / batches / 1e6:.1f} MB/batch); "
                f"parent_batches {stats.get('parent_batches', 0)} of {batches * (1 + args.epochs)}; "
                f"cache hits {stats['cache_hits']}\n"
            )
            out.flush()


if __name__ == "__main__":
    main()
