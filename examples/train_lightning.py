"""Train a small CNN with PyTorch Lightning on gpufeed's demo images, checkpointing mid-epoch.

    pip install gpufeed[lightning]
    python examples/train_lightning.py --fast                 # a few seconds on a CPU
    python examples/train_lightning.py --devices 2            # DDP: Lightning injects a DistributedSampler
    python examples/train_lightning.py --resume               # after an interruption: continue from
                                                              # the last checkpoint, mid-epoch

The FastLoader is passed to ``trainer.fit`` as is: Lightning rebuilds it with its sampler and
every gpufeed option (normalize, dtype, cache_bytes, ...) stays. Its ``state_dict`` goes into
Lightning's checkpoints, so ``--resume`` continues mid-epoch with the next unseen batch.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop
from gpufeed.synth import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class SmallCNN(pl.LightningModule):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, num_classes),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch  # normalized float32 [N, 3, H, W], int64 [N]
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an image folder (root/class/img.jpg); default: demo images")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "gpufeed-lightning"))
    parser.add_argument("--fast", action="store_true", help="tiny run: 1 epoch, 32 px")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, help="default: 1 with --fast, else 3")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/ckpt/last.ckpt")
    args = parser.parse_args()
    out = Path(args.out)
    size = 32 if args.fast else 64
    root = Path(args.data) if args.data else out / "images"
    if args.data is None and not root.exists():
        make_image_folder(root, num_classes=4, per_class=16 if args.fast else 64, size=(80, 96), seed=0)

    pl.seed_everything(0)
    dataset = ImageFolder(root, transform=RandomResizedCrop(size))
    loader = FastLoader(
        dataset, batch_size=16, shuffle=True, num_workers=args.workers,
        normalize=(MEAN, STD), dtype=torch.float32, cache_bytes="256MB", seed=0,
        generator=torch.Generator().manual_seed(0),  # the order of every epoch is reproducible on resume
    )
    checkpoints = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=2, save_last=True)
    trainer = pl.Trainer(
        accelerator="auto", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs or (1 if args.fast else 3), callbacks=[checkpoints], default_root_dir=out,
        logger=False, enable_progress_bar=not args.fast, log_every_n_steps=1,
    )
    last = out / "ckpt" / "last.ckpt"
    trainer.fit(SmallCNN(len(dataset.classes)), train_dataloaders=loader,
                ckpt_path=last if args.resume and last.exists() else None)
    if trainer.is_global_zero:
        stats = trainer.train_dataloader.stats()
        loss = trainer.callback_metrics.get("loss")  # none when a resumed run had nothing left to do
        print(f"trained {trainer.global_step} steps; loss {float('nan') if loss is None else float(loss):.3f}; "
              f"{stats['images']} images through gpufeed at {stats['images_per_s']:.0f}/s; checkpoint {last}")


if __name__ == "__main__":
    main()
