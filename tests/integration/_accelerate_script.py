"""Run under torchrun (2 CPU ranks, gloo): FastLoaders prepared with the real HF Accelerate.

    python -m torch.distributed.run --nproc_per_node 2 _accelerate_script.py IMAGE_ROOT CKPT_DIR

Rank 0 prints one JSON line (``RESULT {...}``): per rank, what each prepared loader yielded
and which process produced it. tests/integration/test_accelerate.py checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration

from gpufeed import DistributedSampler, FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop
from gpufeed.integrations.accelerate import AcceleratedFastLoader, prepare, skip_first_batches

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Tagged(torch.utils.data.Dataset):
    """Sample ``i``: ``(i, pid of the process that made it, a float row)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return i, os.getpid(), torch.full((3,), float(i))


def indices(batch: Any) -> list[int]:
    return [int(i) for i in batch[0]]


def train_epochs(acc: Accelerator) -> dict[str, Any]:
    """32 samples, batch 4, shuffled, 2 epochs: what this rank saw and who made it."""
    loader = prepare(acc, FastLoader(Tagged(32), batch_size=4, shuffle=True, num_workers=2))
    out: dict[str, Any] = {"type": type(loader).__name__, "is_fastloader": isinstance(loader, FastLoader),
                           "len": len(loader), "main_pid": os.getpid(), "registered": loader in acc._dataloaders,
                           "prepare_again_same": acc.prepare(loader) is loader}
    for epoch in range(2):
        seen, pids, worker_pids = [], set(), set()
        for batch in loader:
            seen += indices(batch)
            pids.update(int(p) for p in batch[1])
            worker_pids.update(loader.worker_pids())
        out[f"epoch{epoch}"] = {"seen": seen, "pids": sorted(pids), "worker_pids": sorted(worker_pids)}
    out["stats_batches"] = loader.stats()["batches"]
    out["iteration"] = loader.iteration
    return out


def evaluate(acc: Accelerator) -> dict[str, Any]:
    """23 samples, batch 4 (the last step pads): gather_for_metrics over the epoch."""
    loader = prepare(acc, FastLoader(Tagged(23), batch_size=4, num_workers=1))
    gathered: list[int] = []
    ends = []
    for batch in loader:
        gathered += [int(i) for i in acc.gather_for_metrics(batch[0])]
        ends.append(acc.gradient_state.end_of_dataloader)
    return {"gathered": gathered, "ends": ends, "remainder": loader.remainder, "len": len(loader)}


def own_sampler(acc: Accelerator) -> dict[str, Any]:
    """gpufeed.DistributedSampler(mode="eval") is kept, not sharded a second time."""
    sampler = DistributedSampler(Tagged(23), shuffle=True, seed=3, mode="eval")
    loader = prepare(acc, FastLoader(Tagged(23), batch_size=4, sampler=sampler, num_workers=1))
    return {"seen": [i for batch in loader for i in indices(batch)], "sharded_by": loader.accelerate.sharded_by}


class Stream(torch.utils.data.IterableDataset):
    """0 .. 21, no len()."""

    def __iter__(self) -> Any:
        return iter(range(22))


def iterable(acc: Accelerator) -> dict[str, Any]:
    """An IterableDataset goes through Accelerate's IterableDatasetShard, read in a gpufeed worker."""
    loader = prepare(acc, FastLoader(Stream(), batch_size=4, num_workers=1))
    return {"dataset": type(loader.dataset).__name__, "seen": [int(i) for batch in loader for i in batch]}


def accumulate() -> list[bool]:
    """gradient_accumulation_steps=3 over 4 steps: sync at step 3 and at the end of the loader."""
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = acc.prepare(torch.nn.Linear(3, 1))
    loader = prepare(acc, FastLoader(Tagged(32), batch_size=4, num_workers=1))
    syncs = []
    for batch in loader:
        with acc.accumulate(model):
            acc.backward(model(batch[2]).sum())
            syncs.append(bool(acc.sync_gradients))
    return syncs


def split_batches() -> dict[str, Any]:
    """split_batches=True: each global batch of 8 is cut in two, a half per rank."""
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    loader = prepare(acc, FastLoader(Tagged(32), batch_size=8, num_workers=1))
    batches = [indices(batch) for batch in loader]
    return {"batches": batches, "total_batch_size": loader.total_batch_size}


def image_path(acc: Accelerator, root: str) -> dict[str, Any]:
    """The image fast path keeps normalize/dtype through prepare; plain accelerator.prepare warns."""
    base = FastLoader(ImageFolder(root, transform=ResizeCenterCrop(32)), batch_size=4, num_workers=1,
                      normalize=(MEAN, STD), dtype=torch.float32)
    loader = prepare(acc, base)
    shapes, dtypes, mins = set(), set(), []
    for images, _labels in loader:
        shapes.add(tuple(images.shape[1:]))
        dtypes.add(str(images.dtype))
        mins.append(float(images.min()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = acc.prepare(FastLoader(ImageFolder(root, transform=ResizeCenterCrop(32)), batch_size=4))
        acc.skip_first_batches(loader, 1)
    return {"shapes": sorted(shapes), "dtypes": sorted(dtypes), "min": min(mins),
            "images": loader.stats()["images"], "plain_type": type(plain).__name__,
            "warnings": [str(w.message) for w in caught if "Accelerate is rebuilding" in str(w.message)],
            "warning_files": [os.path.basename(w.filename) for w in caught]}


def host_cache(acc: Accelerator, root: str, scope: str = "auto") -> dict[str, Any]:
    """The host cache through prepare: both ranks' loaders share one cache, so epoch 2 (a new
    shuffle, half of it samples the other rank read in epoch 1) is served from it."""
    base = FastLoader(ImageFolder(root, transform=ResizeCenterCrop(32)), batch_size=2, shuffle=True,
                      num_workers=1, persistent_workers=True, cache_bytes="60%", cache_scope=scope,
                      seed=3)
    loader = prepare(acc, base)
    rates, seen, before = [], [], (0, 0)
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen.append([hashlib.sha1(x.numpy().tobytes()).hexdigest()[:12] for images, _y in loader
                     for x in images])
        stats = loader.stats()
        hits, misses = stats["cache_hits"] - before[0], stats["cache_misses"] - before[1]
        before = (stats["cache_hits"], stats["cache_misses"])
        rates.append(hits / max(1, hits + misses))
        acc.wait_for_everyone()  # every rank has filled epoch 1 before epoch 2 starts
    out = {"hit_rates": rates, "shared": stats["cache_shared"], "seen": seen, "type": type(loader).__name__}
    loader.close()
    return out


def image_resume(root: str) -> dict[str, Any]:
    """Image path, random crops: a state taken after 2 batches, loaded into a loader with another
    num_workers, yields the rest of the epoch byte for byte."""
    acc = Accelerator(cpu=True)

    def make(workers: int) -> AcceleratedFastLoader:
        dataset = ImageFolder(root, transform=RandomResizedCrop(24))
        return prepare(acc, FastLoader(dataset, batch_size=2, shuffle=True, num_workers=workers, seed=7))

    loader, rest, state = make(1), [], None
    for step, (images, _labels) in enumerate(loader):
        if step == 1:
            state = loader.state_dict()
        elif step > 1:
            rest.append(images.clone())
    again = make(2)
    again.load_state_dict(state)
    resumed = [images.clone() for images, _labels in again]
    return {"rest": len(rest), "equal": len(rest) == len(resumed) and all(map(torch.equal, rest, resumed))}


def resume(ckpt: str) -> dict[str, Any]:
    """save_state after 3 batches, load_state into a new loader: the rest of the epoch matches."""
    config = DataLoaderConfiguration(use_stateful_dataloader=True)

    def make(acc: Accelerator) -> AcceleratedFastLoader:
        return prepare(acc, FastLoader(Tagged(40), batch_size=4, shuffle=True, num_workers=2))

    acc = Accelerator(cpu=True, dataloader_config=config)
    loader = make(acc)
    loader.set_epoch(1)
    head, rest = [], []
    for step, batch in enumerate(loader):
        (head if step < 3 else rest).append(indices(batch))
        if step == 2:
            state = loader.state_dict()
            acc.save_state(ckpt)
            acc.wait_for_everyone()
    acc2 = Accelerator(cpu=True, dataloader_config=config)
    again = make(acc2)
    acc2.load_state(ckpt)
    resumed = [indices(batch) for batch in again]
    skipped = skip_first_batches(make(Accelerator(cpu=True)), 2)
    other_world = {**state, "accelerate": {**state["accelerate"], "num_processes": 3}}
    three = DistributedSampler(Tagged(8), num_replicas=3, rank=0)
    errors = [error_of(make(acc2).load_state_dict, other_world),
              error_of(prepare, acc2, torch.utils.data.DataLoader(Tagged(4))),
              error_of(prepare, acc2, FastLoader(Tagged(8), sampler=three))]
    return {"head": head, "rest": rest, "resumed": resumed, "stateful": loader.use_stateful_dataloader,
            "files": sorted(os.listdir(ckpt)), "iteration_after": again.iteration,
            "skipped_len": len(skipped), "full_len": len(loader),
            "skipped_batches": sum(1 for _ in skipped), "state": state, "errors": errors}


def error_of(fn: Any, *args: Any) -> str:
    try:
        fn(*args)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def main() -> None:
    root, ckpt = sys.argv[1], sys.argv[2]
    acc = Accelerator(cpu=True)
    report: dict[str, Any] = {
        "world": acc.num_processes,
        "train": train_epochs(acc),
        "eval": evaluate(acc),
        "own_sampler": own_sampler(acc),
        "split": split_batches(),
        "accumulate": accumulate(),
        "iterable": iterable(acc),
        "image": image_path(acc, root),
        "host_cache": host_cache(acc, root),
        "resume": resume(ckpt),
        "image_resume": image_resume(root),
    }
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, report)
    if acc.is_main_process:
        print("RESULT " + json.dumps(ranks), flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
