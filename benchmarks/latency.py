"""Slow storage: images/s and memory against per-read latency, FastLoader vs DataLoader.

A dataset returns (JPEG bytes, label) after an injected wait (``--latency-ms``, default
0 5 30 100), as a network file system or object store would. For each latency, in one run and
alternating rounds (``gpufeed.compare._compare``): torch's DataLoader over the same
``ImageDataset`` (one read at a time per worker), and FastLoader at each ``--concurrency`` (the
dataset's ``read_concurrency``), all at the same ``num_workers``. At each latency above 0 the
local-disk rate (FastLoader's defaults, rc=1, over the same images with no wait) runs in the same
alternating rounds. Reported per loader: images/s, the ratio to DataLoader and to the same loader
at 0 ms, the ratio to the local-disk rate (median of the per-round ratios, and each round's, so a
shared host's load swings cancel out), and peak PSS relative to the first loader (its growth with
concurrency stays within ``read_budget_bytes`` per worker).

    python -m benchmarks.latency [--latency-ms 0 30] [--concurrency 1 16] [--workers 2]
                                 [--batches 8] [--rounds 3] [--budget-mib 64] [--no-dataloader]
                                 [--prefetch-factor 2]

Goals (2 cores, 30 ms, num_workers=2): >= 640 img/s at read_concurrency=16; within 20%
of the local-disk rate ("x local") once enough reads are in flight (16 reads per 30 ms cap a
worker at 533 img/s: use 64); at 0 ms, the default (read_concurrency=1) within 3% of its rate
before reads in flight existed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from gpufeed import FastLoader, ImageDataset, RandomResizedCrop
from gpufeed.compare import compare, format_bytes

LOCAL = "local, 0 ms rc=1"


def photo_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` smooth, photo-like 400x350 JPEGs (about 20-40 KB each)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = rng.integers(0, 255, (12, 14, 3), dtype=np.uint8)
        img = cv2.resize(small, (400, 350), interpolation=cv2.INTER_CUBIC)
        img = cv2.add(img, rng.integers(0, 24, img.shape, dtype=np.uint8))
        out.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    return out


class SlowJpegs(Dataset):
    """(JPEG bytes, label) after ``latency_s`` (time.sleep: a blocking read, GIL released)."""

    def __init__(self, items: list[bytes], latency_s: float) -> None:
        self.items, self.latency_s = items, latency_s

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if self.latency_s:
            time.sleep(self.latency_s)
        return self.items[i], i % 10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latency-ms", type=float, nargs="+", default=[0, 5, 30, 100])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=8, help="batches per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-mib", type=int, default=64, help="read_budget_bytes per worker")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--prefetch-factor", type=int, default=2,
                   help="tasks each worker holds (reads run ahead only within them)")
    p.add_argument("--no-dataloader", action="store_true",
                   help="leave torch's DataLoader out (quicker before/after comparisons)")
    args = p.parse_args(argv)
    items = photo_jpegs(args.images)
    transform = RandomResizedCrop(224, seed=0)
    budget = args.budget_mib << 20
    print(f"{args.images} JPEGs of 400x350 ({np.mean([len(b) for b in items]) / 1e3:.0f} KB mean), "
          f"batch {args.batch_size}, num_workers={args.workers}, "
          f"prefetch_factor={args.prefetch_factor}, train transform 224, "
          f"read_budget_bytes={format_bytes(budget)} per worker")
    base_rate: dict[int, float] = {}
    local = ImageDataset(SlowJpegs(items, 0.0), transform)  # FastLoader's defaults on local disk
    for latency_ms in args.latency_ms:
        src = SlowJpegs(items, latency_ms / 1e3)
        kw = dict(batch_size=args.batch_size, num_workers=args.workers, shuffle=True,
                  persistent_workers=True, prefetch_factor=args.prefetch_factor)
        factories: dict[str, Callable[[], Iterable[Any]]] = {}
        if not args.no_dataloader:
            factories["DataLoader"] = lambda src=src, kw=kw: DataLoader(ImageDataset(src, transform), **kw)
        for c in args.concurrency:
            ds = ImageDataset(src, transform, read_concurrency=c, read_budget_bytes=budget)
            factories[f"FastLoader rc={c}"] = lambda ds=ds, kw=kw: FastLoader(ds, **kw)
        if latency_ms:  # the local-disk rate, measured in the same alternating rounds
            factories[LOCAL] = lambda kw=kw: FastLoader(local, **kw)
        result = compare(factories, num_batches=args.batches, num_rounds=args.rounds,
                         baseline=next(iter(factories)))
        first = result.summary(next(iter(factories)))
        for name in factories:
            s = result.summary(name)
            rate = s.median_batches_per_s * args.batch_size
            c = int(name.split("rc=")[1]) if "rc=" in name else 0  # 0: DataLoader
            if latency_ms == 0:
                base_rate[c] = rate
            vs = "" if args.no_dataloader else f"  {result.ratio(name):5.2f}x DataLoader"
            if c in base_rate:
                vs += f", {rate / base_rate[c]:.2f}x its 0 ms rate"
            if latency_ms and name != LOCAL:
                paired = sorted(result.paired_ratios(name, LOCAL))
                vs += (f", {statistics.median(paired):.2f}x local (rounds "
                       f"{', '.join(f'{r:.2f}' for r in paired)})")
            print(f"latency {latency_ms:5.0f} ms  {name:18s} {rate:7.0f} img/s{vs}  peak PSS "
                  f"{format_bytes(s.peak_pss_bytes)} ({s.peak_pss_bytes / max(first.peak_pss_bytes, 1):.2f}x)")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
