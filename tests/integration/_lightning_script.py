"""Lightning runs of tests/integration/test_lightning*.py, one or more per process tree.

``strategy="ddp"`` re-executes ``sys.argv`` for each extra rank, so these runs live in a script,
not in pytest's process. Samples are image-path samples whose label is the sample's index, so
``training_step`` records exactly which samples it trained on.

    python _lightning_script.py hook   ROOT OUT
    python _lightning_script.py resume ROOT OUT [--pause-at STEP] [--ckpt PATH] [--devices N]
                                       [--workers N] [--sampler {shuffle|global}]
    python _lightning_script.py RUN + RUN + ...

``RUN + RUN``: the runs one after the other in one process tree (one import of Lightning, one
set of DDP ranks), each with its own ``OUT``; every run must use the same number of devices.

Every run that ends writes ``OUT/rank-R.json`` on each rank: the loader Lightning iterated (type,
options, sampler), the first batch's dtype and range, and the indices each epoch trained on.

``hook``: ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` for 2 epochs, the loader made
in ``train_dataloader()``.

``resume``: the loader passed to ``trainer.fit``; trains for 2 epochs with a checkpoint every
``CKPT_EVERY`` steps (``save_last``). ``--sampler global``: the loader's sampler is one of the
user's (``GlobalShuffle``) instead of ``shuffle=True``.

In every run, ``training_step`` appends ``global_step rank indices`` to ``OUT/trained-R.txt``
(flushed, fsynced) before the optimizer step. ``--pause-at STEP`` writes ``OUT/paused`` at that
step and sleeps (the test SIGKILLs it); ``--ckpt`` resumes from a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from gpufeed import FastLoader, ImageDataset, ImageFolder, RandomResizedCrop

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 4
CKPT_EVERY = 2
OPTIONS = ("normalize", "dtype", "cache_bytes", "seed", "max_batch_bytes", "shutdown_timeout_s", "on_error")


def indexed_images(root: str) -> ImageDataset:
    """The demo images, each labelled with its own index."""
    folder = ImageFolder(root)
    return ImageDataset([(path, i) for i, (path, _) in enumerate(folder.samples)], transform=RandomResizedCrop(32))


class GlobalShuffle(torch.utils.data.Sampler[int]):
    """A sampler of the user's: a new order each pass from torch's global RNG (which Lightning's
    checkpoint does not hold; the loader's state does)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def make_loader(root: str, num_workers: int = 1, sampler: str = "shuffle") -> FastLoader:
    dataset = indexed_images(root)
    order: dict[str, Any] = (
        {"shuffle": True, "generator": torch.Generator().manual_seed(3)}  # later resumed epochs are exact too
        if sampler == "shuffle" else {"sampler": GlobalShuffle(len(dataset))}
    )
    return FastLoader(
        dataset, batch_size=BATCH, num_workers=num_workers,
        normalize=(MEAN, STD), dtype=torch.float32, cache_bytes="64MB", seed=11,
        max_batch_bytes=1 << 22, shutdown_timeout_s=4.0, **order,
    )


def describe(loader: Any) -> dict[str, Any]:
    options = {}
    for name in OPTIONS:
        value = getattr(loader, name, "<missing>")
        options[name] = str(value) if isinstance(value, torch.dtype) else value
    sampler = loader.sampler
    return {
        "type": type(loader).__name__,
        "module": type(loader).__module__,
        "options": json.loads(json.dumps(options, default=list)),
        "num_workers": loader.num_workers,
        "sampler": f"{type(sampler).__module__}.{type(sampler).__name__}",
        "sampler_rank": getattr(sampler, "rank", None),
        "sampler_replicas": getattr(sampler, "num_replicas", None),
        "sampler_shuffle": getattr(sampler, "shuffle", None),
    }


class Tiny(pl.LightningModule):
    """A tiny CNN trained to regress a constant: the point is the samples it sees."""

    def __init__(self, root: str, out: str, in_hook: bool, pause_at: int | None = None) -> None:
        super().__init__()
        self.root, self.out, self.in_hook, self.pause_at = root, Path(out), in_hook, pause_at
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(4, 1))
        self.epochs: dict[int, list[int]] = {}
        self.first: dict[str, Any] | None = None
        self.record = None

    def train_dataloader(self) -> FastLoader:
        if not self.in_hook:
            raise RuntimeError("train_dataloader() is only used by the `hook` runs")
        return make_loader(self.root)

    def on_train_start(self) -> None:
        self.record = open(self.out / f"trained-{self.global_rank}.txt", "a")  # noqa: SIM115

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        if self.first is None:
            self.first = {"dtype": str(images.dtype), "shape": list(images.shape),
                          "min": float(images.min()), "max": float(images.max()),
                          "loader": describe(self.trainer.train_dataloader)}
        indices = labels.tolist()
        self.epochs.setdefault(self.current_epoch, []).extend(indices)
        assert self.record is not None
        self.record.write(f"{self.global_step} {self.global_rank} {' '.join(map(str, indices))}\n")
        self.record.flush()
        os.fsync(self.record.fileno())
        if self.pause_at is not None and self.global_step == self.pause_at:
            (self.out / "paused").write_text(str(os.getpid()))
            time.sleep(600)  # the test SIGKILLs us here, mid-epoch, between two checkpoints
        return self.net(images).pow(2).mean()

    def on_train_end(self) -> None:
        report = {"rank": self.global_rank, "world_size": self.trainer.world_size, "first": self.first,
                  "engine_batches": self.trainer.train_dataloader.stats()["batches"],
                  "epochs": {str(e): v for e, v in self.epochs.items()}}
        (self.out / f"rank-{self.global_rank}.json").write_text(json.dumps(report))
        if self.record is not None:
            self.record.close()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(devices: int, out: Path, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=2,
        logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=str(out), **kw,
    )


def main(argv: list[str]) -> None:
    """Each run of ``argv``, split at ``+``, in order."""
    torch.set_num_threads(1)
    run: list[str] = []
    for arg in [*argv, "+"]:
        if arg != "+":
            run.append(arg)
        elif run:
            fit_one(run)
            run = []


def fit_one(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("hook", "resume"))
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--pause-at", type=int)
    parser.add_argument("--ckpt")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sampler", choices=("shuffle", "global"), default="shuffle")
    args = parser.parse_args(argv)
    pl.seed_everything(5, verbose=False)
    out = Path(args.out)
    if args.mode == "hook":
        trainer(2, out, enable_checkpointing=False).fit(Tiny(args.root, args.out, in_hook=True))
        return
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = ModelCheckpoint(dirpath=str(out / "ckpt"), every_n_train_steps=CKPT_EVERY, save_last=True,
                                  save_top_k=-1, filename="{step}")
    model = Tiny(args.root, args.out, in_hook=False, pause_at=args.pause_at)
    run = trainer(args.devices, out, callbacks=[checkpoints])
    run.fit(model, train_dataloaders=make_loader(args.root, args.workers, args.sampler), ckpt_path=args.ckpt)


if __name__ == "__main__":
    main(sys.argv[1:])
