"""Plain torchrun DDP on gpufeed: DistributedSampler, set_epoch, mid-epoch checkpoints, resume.

    torchrun --nproc_per_node 2 examples/train_ddp.py --data ./demo-data --ckpt ./ddp.pt
    torchrun --nproc_per_node 2 examples/train_ddp.py --fast   # seconds, on CPU

Trains a small CNN on gpufeed's demo images (photo-like JPEGs made once with
``gpufeed.synth.make_image_folder``; the label is the class folder). Each rank reads its share
through ``gpufeed.DistributedSampler``; ``loader.set_epoch(epoch)`` reaches the sampler and the
augmentations. Every ``--ckpt-every`` steps rank 0 saves the model, the optimizer and
``loader.state_dict()`` (the loader's position: a few numbers, valid on any world size). Run
the same command again and it resumes from that checkpoint, mid-epoch, with the very batches
the interrupted run had not trained on yet. ``--stop-after N`` exits after N steps (a stand-in
for a job killed mid-epoch) so you can watch it resume.

GPU: NCCL and ``device="cuda:LOCAL_RANK"`` (gpufeed copies batches ahead on its own stream and
normalizes on the GPU); CPU: gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpufeed import DistributedSampler, FastLoader, ImageFolder, RandomResizedCrop
from gpufeed.synth import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def small_cnn(num_classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, 2, 1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, num_classes),
    )  # fmt: skip


def demo_images(root: Path, images: int, size: tuple[int, int]) -> None:
    """Rank 0 writes the demo folder once; the others wait for it."""
    if dist.get_rank() == 0 and not any(root.glob("class_*/*.jpg")):
        make_image_folder(root, num_classes=4, per_class=images // 4, size=size, seed=0)
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--ckpt", type=Path, default=Path("ddp-checkpoint.pt"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ckpt-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--stop-after", type=int, default=None, help="exit after this many steps (simulated kill)")
    parser.add_argument("--fast", action="store_true", help="a tiny run: 64 small images, 2 epochs, 1 worker")
    args = parser.parse_args()
    if args.fast:
        args.images, args.crop, args.batch_size, args.workers, args.epochs, args.ckpt_every = 64, 32, 4, 1, 2, 3

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    demo_images(args.data, args.images, (72, 88) if args.fast else (350, 400))

    dataset = ImageFolder(args.data, transform=RandomResizedCrop(args.crop))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # world size and rank from the process group
    loader = FastLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        normalize=(MEAN, STD), seed=0, device=device if cuda else None)  # fmt: skip
    torch.manual_seed(0)
    model = DistributedDataParallel(small_cnn(len(dataset.classes)).to(device), device_ids=[device] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start_epoch, resumed_from = 0, None
    if args.ckpt.exists():  # resume: model, optimizer, and where the loader was in its epoch
        ckpt = torch.load(args.ckpt, map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # the next iter() yields the rest of that epoch
        start_epoch, resumed_from = ckpt["epoch"], ckpt["step"]
    step = resumed_from or 0
    steps_run = samples_run = 0
    t0 = time.perf_counter()
    loss = torch.zeros((), device=device)
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # reaches the DistributedSampler: a new order each epoch
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, steps_run, samples_run = step + 1, steps_run + 1, samples_run + len(labels)
            if step % args.ckpt_every == 0 and rank == 0:  # the loader state is the same on every rank
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                         "loader": loader.state_dict(), "epoch": epoch, "step": step}  # fmt: skip
                torch.save(state, f"{args.ckpt}.tmp")
                os.replace(f"{args.ckpt}.tmp", args.ckpt)  # never a half-written checkpoint
            if args.stop_after is not None and steps_run == args.stop_after:
                dist.barrier()  # the checkpoint is on disk before any rank exits
                print(f"rank {rank}: stopping after {steps_run} steps (simulated kill)", flush=True)
                dist.destroy_process_group()
                return
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    counts = [None] * world
    dist.all_gather_object(counts, {"steps": steps_run, "samples": samples_run})
    if rank == 0:
        summary = {"world": world, "resumed_from_step": resumed_from, "last_step": step, "per_rank": counts,
                   "final_loss": float(loss.item()), "stats": {k: loader.stats()[k] for k in ("batches", "images")}}
        print("SUMMARY " + json.dumps(summary), flush=True)
    # every rank here before any tears gloo down: a rank still in the collective layer when its
    # peer destroys the group aborts at exit ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
