"""The host cache on the per-sample path over slow storage: ``gpufeed.SegmentationDataset`` whose
reads each wait ``--delay-ms`` (as a network filesystem's first byte), with and without
``cache_bytes``, the same pipeline (RandomResizedCrop(256), flip, float32) and loader settings.

    PYTHONPATH=$PWD .venv-tv/bin/python -m benchmarks.detection_cache [OUT] [--images 384] \
        [--delay-ms 20] [--read-concurrency N] [--workers 2] [--batch-size 32] [--epochs 3] [--rounds 2]

Each round makes one loader per variant (persistent workers) and runs ``--epochs`` epochs: the
first reads every sample (cold), the later ones are timed (images/s); the variants alternate,
their order rotating by round. Reported per variant: the median images/s of the later epochs,
the cached loader's ratio to the uncached one, and the cache's hits. OUT (default
./demo-detection) holds ``benchmarks/detection.py``'s data, written once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks._coco_data import prepare
from benchmarks._common import uptime


def slow_segmentation(images: Any, masks: Any, transforms: Any, delay_s: float,
                      read_concurrency: int | None) -> Any:
    """A ``gpufeed.SegmentationDataset`` whose ``read_item`` first sleeps ``delay_s``
    (``read_concurrency`` None: the dataset's default, reads ahead once reads stall)."""
    from gpufeed import SegmentationDataset

    class SlowSegmentation(SegmentationDataset):
        delay = delay_s

        def read_item(self, index: int) -> Any:
            time.sleep(self.delay)
            return super().read_item(index)

        def __repr__(self) -> str:
            return f"SlowSegmentation({len(self)} pairs, {self.delay * 1000:g} ms a read)"

    return SlowSegmentation(list(images), list(masks), transforms=transforms, read_concurrency=read_concurrency)


def measure(make: Any, epochs: int) -> tuple[list[float], dict[str, Any]]:
    """images/s of epochs 2.. of one loader (epoch 1 fills the cache), and its stats."""
    loader = make()
    rates = []
    for epoch in range(epochs):
        t0, n = time.perf_counter(), 0
        for images, _ in loader:
            n += len(images)
        if epoch:
            rates.append(n / (time.perf_counter() - t0))
    stats = loader.stats()
    loader.close()
    return rates, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="demo-detection")
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--read-concurrency", type=int, default=None,
                        help="reads in flight per worker; default: the dataset's (ahead once reads stall)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-bytes", default="1GB")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first epoch fills the cache")

    import gpufeed
    from benchmarks.detection import crop_flip

    _, seg = prepare(args.out, args.images)
    dataset = slow_segmentation(seg.images, seg.masks, crop_flip(), args.delay_ms / 1000, args.read_concurrency)
    variants = {"no cache": 0, f"cache_bytes={args.cache_bytes}": args.cache_bytes}

    def factory(cache: Any) -> Any:
        return lambda: gpufeed.FastLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                          shuffle=True, persistent_workers=args.workers > 0, cache_bytes=cache,
                                          generator=torch.Generator().manual_seed(0))

    before = uptime()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    hits: dict[str, int] = {}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:
            got, stats = measure(factory(variants[name]), args.epochs)
            rates[name] += got
            hits[name] = stats["cache_hits"]
    medians = {name: statistics.median(v) for name, v in rates.items()}
    print(f"{len(seg.images)} image + mask pairs, {args.delay_ms:g} ms per read, read_concurrency "
          f"{args.read_concurrency or 'auto'}, {args.workers} workers, batch {args.batch_size}; epochs 2-{args.epochs} "
          f"of {args.rounds} rounds")
    for name in names:
        print(f"{name:24s} {medians[name]:8.1f} images/s   per epoch {[round(x) for x in rates[name]]}   "
              f"cache hits (last loader) {hits[name]}")
    cached, plain = names[1], names[0]
    print(f"cached / uncached: {medians[cached] / medians[plain]:.2f}x")
    print(f"uptime before: {before}\nuptime after:  {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
