"""HF Accelerate on gpufeed: prepare(accelerator, loader), gather_for_metrics, save_state/load_state.

    accelerate launch --num_processes 2 examples/train_accelerate.py --data ./demo-data
    torchrun --nproc_per_node 2 examples/train_accelerate.py --fast   # seconds, on CPU

Trains a small CNN on gpufeed's demo images (made once with ``gpufeed.synth.make_image_folder``)
and evaluates it after each epoch. ``gpufeed.integrations.accelerate.prepare(accelerator, loader)``
replaces ``accelerator.prepare(loader)`` for the loaders: Accelerate shards them, places the
batches and tracks the end of the epoch (so ``gather_for_metrics`` counts every eval image exactly
once), while the batches come from gpufeed's workers and image path. With
``use_stateful_dataloader=True``, ``accelerator.save_state()`` also stores each loader's position
and ``load_state()`` restores it: run the same command again after ``--stop-after N`` and it
resumes mid-epoch, where the last checkpoint was taken.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop
from gpufeed.integrations.accelerate import prepare
from gpufeed.synth import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def small_cnn(num_classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, 2, 1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, num_classes),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--ckpt", type=Path, default=Path("accelerate-checkpoint"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ckpt-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--stop-after", type=int, default=None, help="exit after this many steps (simulated kill)")
    parser.add_argument("--fast", action="store_true", help="a tiny run: 60 small images, 2 epochs, 1 worker")
    args = parser.parse_args()
    if args.fast:
        args.images, args.crop, args.batch_size, args.workers, args.epochs, args.ckpt_every = 60, 32, 4, 1, 2, 3

    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # without a GPU, torchrun's ranks are CPU processes (gloo)
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
    )
    with accelerator.main_process_first():  # the demo images, written once
        if accelerator.is_main_process and not any(args.data.glob("class_*/*.jpg")):
            size = (72, 88) if args.fast else (350, 400)
            make_image_folder(args.data, num_classes=4, per_class=args.images // 4, size=size, seed=0)

    common = {"batch_size": args.batch_size, "num_workers": args.workers, "normalize": (MEAN, STD)}
    train = ImageFolder(args.data, transform=RandomResizedCrop(args.crop))
    evaluation = ImageFolder(args.data, transform=ResizeCenterCrop(args.crop))
    # Built as for one process: Accelerate shards them. (accelerator.prepare(loader) would swap
    # gpufeed's engine for a plain DataLoader: gpufeed warns if you do.)
    train_loader = prepare(accelerator, FastLoader(train, shuffle=True, seed=0, **common))
    eval_loader = prepare(accelerator, FastLoader(evaluation, **common))
    torch.manual_seed(0)
    model = small_cnn(len(train.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)

    resumed_from = None
    if (args.ckpt / "progress.json").exists():  # model, optimizer, RNGs and both loaders' positions
        accelerator.load_state(args.ckpt)
        resumed_from = json.loads((args.ckpt / "progress.json").read_text())["step"]
    step = resumed_from or 0
    steps_run = 0
    summary: dict[str, object] = {}
    for epoch in range(train_loader.iteration, args.epochs):  # iteration: the epoch the loader is in
        model.train()
        for images, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            step, steps_run = step + 1, steps_run + 1
            if step % args.ckpt_every == 0:
                accelerator.save_state(args.ckpt)  # every rank: its loader state goes in too
                if accelerator.is_main_process:
                    (args.ckpt / "progress.json").write_text(json.dumps({"step": step}))
                accelerator.wait_for_everyone()
            if args.stop_after is not None and steps_run == args.stop_after:
                accelerator.print(f"stopping after {steps_run} steps (simulated kill)")
                accelerator.end_training()
                return
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in eval_loader:
                predictions, labels = accelerator.gather_for_metrics((model(images).argmax(1), labels))
                correct += int((predictions == labels).sum())
                seen += len(labels)  # all ranks, padding of the last step dropped: len(evaluation) in all
        accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}, eval accuracy {correct / seen:.3f} on {seen}")
        summary = {"epoch": epoch, "eval_seen": seen, "eval_dataset": len(evaluation), "accuracy": correct / seen}
    steps = accelerator.gather(torch.tensor([steps_run], device=accelerator.device)).tolist()
    if accelerator.is_main_process:
        stats = train_loader.stats()
        summary.update(world=accelerator.num_processes, resumed_from_step=resumed_from, last_step=step,
                       steps_per_rank=steps, loader=type(train_loader).__name__, images=stats["images"])
        print("SUMMARY " + json.dumps(summary), flush=True)
    accelerator.wait_for_everyone()  # every rank done with gloo before any tears it down
    accelerator.end_training()


if __name__ == "__main__":
    main()
