"""Run under torchrun (2 CPU ranks, gloo): FastLoader + gpufeed.DistributedSampler per rank.

Rank 0 prints one JSON line: for each (mode, epoch), the sample indices each rank's loader
yielded, gathered with all_gather_object. tests/integration/test_ddp_sampler.py checks them.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from gpufeed import DistributedSampler, FastLoader

NUM_SAMPLES = 23  # not a multiple of the world size: train mode pads, eval mode does not


class Numbers(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def main() -> None:
    dist.init_process_group("gloo")
    report: dict[str, object] = {"world_size": dist.get_world_size(), "num_samples": NUM_SAMPLES}
    for mode in ("train", "eval"):
        sampler = DistributedSampler(Numbers(), shuffle=True, seed=11, mode=mode)  # world and rank from dist
        loader = FastLoader(Numbers(), batch_size=4, sampler=sampler, num_workers=1)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            seen = [int(i) for batch in loader for i in batch]
            per_rank: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, {"seen": seen, "len": len(sampler), "order": sampler.global_order()})
            report[f"{mode}/{epoch}"] = per_rank
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(report), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
