"""Pinned workers of several local ranks: split among the ranks vs each rank alone.

    torchrun --nproc_per_node W benchmarks/local_ranks.py [--workers K] [--batches N] [--rounds R]

Every rank runs an image loader (``RandomResizedCrop(224)`` over a synthetic folder, batch 32)
with ``pin_workers=True``, K workers, rounds alternating between:

* ``split``: the ranks split the CPUs they share (``LOCAL_RANK``/``LOCAL_WORLD_SIZE``);
* ``alone``: ``local_ranks=(0, 1)``, each rank pinned as if alone on the host: worker k of every
  rank on the k-th CPU (what pinning did before ranks split their CPUs).

Each round: warm-up, a barrier, N timed batches on every rank at once, a barrier. Rank 0 prints
one JSON line: per mode, the host's images/s (summed over ranks, median over rounds), the ratio
split / alone, the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch.distributed as dist

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop
from gpufeed.compare._environment import describe_environment
from gpufeed.synth import make_image_folder


def run(root: str, mode: str, workers: int, batches: int) -> float:
    """This rank's images/s over ``batches`` timed batches, every rank timing at once."""
    local = (0, 1) if mode == "alone" else None
    loader = FastLoader(ImageFolder(root, transform=RandomResizedCrop(224)), batch_size=32, shuffle=True,
                        num_workers=workers, persistent_workers=True, pin_workers=True, local_ranks=local)
    with loader:
        stream = iter(loader)
        for _ in range(workers * 2 + 1):
            next(stream)
        dist.barrier()
        t0 = time.perf_counter()
        images = 0
        for _ in range(batches):
            try:
                images += len(next(stream)[1])
            except StopIteration:
                stream = iter(loader)
                images += len(next(stream)[1])
        elapsed_s = time.perf_counter() - t0
        dist.barrier()
    return images / elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with tempfile.TemporaryDirectory() as tmp:
        root = [os.path.join(tmp, "images")]
        if rank == 0:
            make_image_folder(root[0], num_classes=4, per_class=64, size=(300, 400))
        dist.broadcast_object_list(root, src=0)  # ranks of one host: the same folder
        rates: dict[str, list[float]] = {"split": [], "alone": []}
        for i in range(args.rounds):
            for mode in (("split", "alone") if i % 2 == 0 else ("alone", "split")):
                mine = run(root[0], mode, args.workers, args.batches)
                every: list[float] = [0.0] * dist.get_world_size()
                dist.all_gather_object(every, mine)
                rates[mode].append(sum(every))
        dist.barrier()  # rank 0's folder stays until every rank is done
    if rank == 0:
        median = {mode: statistics.median(r) for mode, r in rates.items()}
        print(json.dumps({"ranks": dist.get_world_size(), "workers_per_rank": args.workers,
                          "host_images_per_s": median, "rounds": rates,
                          "split_over_alone": median["split"] / median["alone"],
                          "environment": describe_environment(args.workers)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
