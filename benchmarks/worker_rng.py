"""Worker CPU per batch of generic datasets, with and without random draws (docs/design/resume.md).

    python -m benchmarks.worker_rng [--epochs 5] [--samples 20000] [--json OUT]

Workers capture their random states after every batch (for exact mid-epoch resume). This
measures what the workers spend per batch on two generic datasets, 64 small samples per batch,
2 persistent workers: ``quiet`` (never draws) and ``drawing`` (every sample draws from torch,
``random`` and numpy). Worker CPU is read with psutil (user + system) over each epoch after a
start-up epoch; figures are medians over ``--epochs`` epochs. To see the capture's cost, run it
alternately against two checkouts in one sitting (``PYTHONPATH=/path/to/checkout``) and compare
the medians: CPU seconds, so other jobs on the machine move them less than wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks._common import cpu_s_by_pid
from gpufeed import FastLoader


class Quiet(Dataset):
    """Small tensors that draw nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.full((3, 8, 8), i % 251, dtype=torch.uint8), i


class Drawing(Quiet):
    """Small samples drawn from torch, random and numpy."""

    def __getitem__(self, i: int) -> Any:
        return torch.rand(3, 8, 8), random.random(), np.random.rand(2)


def worker_cpu_s(pids: list[int]) -> float:
    return sum(cpu_s_by_pid(pids).values())


def measure(dataset: Dataset, epochs: int) -> list[float]:
    """Worker CPU ms per batch of each measured epoch."""
    loader = FastLoader(dataset, batch_size=64, num_workers=2, persistent_workers=True,
                        generator=torch.Generator().manual_seed(0))
    try:
        for _ in loader:  # start-up
            pass
        out = []
        for _ in range(epochs):
            pids = loader.worker_pids()
            before = worker_cpu_s(pids)
            batches = sum(1 for _ in loader)
            out.append((worker_cpu_s(pids) - before) / batches * 1e3)
        return out
    finally:
        loader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = {}
    for name, dataset in (("quiet", Quiet(args.samples)), ("drawing", Drawing(args.samples))):
        readings = measure(dataset, args.epochs)
        result[name] = {"worker_cpu_ms_per_batch": statistics.median(readings), "readings": readings}
        print(f"{name:8s} worker CPU {statistics.median(readings):.3f} ms per batch (median of {args.epochs} epochs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
