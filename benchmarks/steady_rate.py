"""Steady images/s of FastLoader alone on an image folder: for A/B runs of two checkouts.

    PYTHONPATH=CHECKOUT python -m benchmarks.steady_rate ROOT [--epochs 8] [--read-concurrency N]

Each epoch builds a fresh loader (workers started again, as with persistent_workers=False),
excludes the first batch (start-up) and times the rest; prints the median over epochs and every
epoch's rate. Run two checkouts alternately on the same folder and compare medians: a lone
figure means little on a shared machine. Eval transform (ResizeCenterCrop(224, 256)), batch 64,
2 workers, uint8 output, as `gpufeed bench`'s eval.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="image folder (ROOT/CLASS/IMAGE), e.g. gpufeed demo's")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--read-concurrency", type=int, default=None,
                        help="ImageFolder's read_concurrency (default: the source's default)")
    args = parser.parse_args()
    extra = {} if args.read_concurrency is None else {"read_concurrency": args.read_concurrency}
    dataset = ImageFolder(args.root, transform=ResizeCenterCrop(224, 256), **extra)
    rates = []
    for _ in range(args.epochs):
        gc.collect()
        loader = FastLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                            generator=torch.Generator().manual_seed(0), seed=0)
        images, t_first = 0, 0.0
        for i, (_, labels) in enumerate(loader):
            if i == 0:
                t_first = time.perf_counter()
                continue
            images += len(labels)
        rates.append(images / (time.perf_counter() - t_first))
        loader.close()
    sys.stdout.write(f"steady img/s median {statistics.median(rates):.0f} "
                     f"(epochs: {', '.join(f'{r:.0f}' for r in rates)})\n")


if __name__ == "__main__":
    main()
