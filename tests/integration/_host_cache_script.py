"""Run under torchrun (2 CPU ranks, gloo): one FastLoader per rank with a shuffling
DistributedSampler and ``cache_bytes="60%"``: the host cache shared by the ranks.

    torchrun --nproc_per_node 2 _host_cache_script.py ROOT

Rank 0 prints ``RESULT {json}``: per rank, the hit rate of each of 3 epochs, the budget and
bytes reported, whether epoch 3's batches equal an uncached loader's.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop


def main(root: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = ImageFolder(root, transform=ResizeCenterCrop(32, 40))
    sampler = DistributedSampler(dataset, shuffle=True, seed=1)
    loader = FastLoader(dataset, batch_size=8, sampler=sampler, num_workers=1, persistent_workers=True,
                        cache_bytes="60%")
    rates, last = [], []
    before = (0, 0)
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = [(x.clone(), y.clone()) for x, y in loader]
        stats = loader.stats()
        hits, misses = stats["cache_hits"] - before[0], stats["cache_misses"] - before[1]
        before = (stats["cache_hits"], stats["cache_misses"])
        rates.append(hits / (hits + misses))
        last = batches
        dist.barrier()  # every rank has filled epoch 1 before epoch 2 starts (the test's premise)
    plain = FastLoader(dataset, batch_size=8, sampler=sampler, num_workers=0)
    plain.set_epoch(2)
    same = all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(last, plain, strict=True))
    stats = loader.stats()
    mine = {"rank": rank, "hit_rates": rates, "budget": stats["cache_budget_bytes"],
            "bytes": stats["cache_bytes"], "shared": stats["cache_shared"], "same": same}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    loader.close()
    if rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
