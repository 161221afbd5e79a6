"""MixUp and CutMix as ``FastLoader(batch_transform=...)`` against the same FastLoader without
them and against ``DataLoader`` with the collate idiom, in one run, alternating rounds.

    PYTHONPATH=$PWD python -m benchmarks.mix [ROOT] [--images 480] [--workers 2] [--batch-size 32]
        [--rounds 5] [--json OUT]

The recipe is torchvision v2's classification one: RandomResizedCrop(224) + RandomHorizontalFlip
+ ToImage + ToDtype(float32, scale=True) + Normalize, the same object for every loader. Loaders
(one table, ``gpufeed.compare._compare.compare(..., rotate=True)``, one epoch per round):

- ``gpufeed``: ``FastLoader(gpufeed.ImageFolder(root, transform=recipe))``, no batch op;
- ``gpufeed MixUp`` / ``gpufeed CutMix``: the same with ``batch_transform=V.MixUp(alpha=0.8)`` /
  ``V.CutMix(alpha=1.0)`` (``num_classes`` of the folder);
- ``DataLoader MixUp`` / ``DataLoader CutMix``: ``torchvision.datasets.ImageFolder(root,
  transform=recipe)`` in torch's ``DataLoader`` with ``collate_fn=lambda b: mix(*default_collate(b))``.

Goals: a batch op costs FastLoader at most 10% (``gpufeed MixUp / gpufeed`` >= 0.9x) and keeps
it at least 2x the DataLoader idiom. Needs torchvision (the ``.venv-tv`` environment). Without
ROOT, ./demo-mix (photo-like JPEGs of ~400x350, ``gpufeed.synth``) is made once and reused.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import uptime

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
OPS = ("MixUp", "CutMix")
GOALS = {"vs gpufeed": 0.9, "vs DataLoader": 2.0}


def make_op(name: str, num_classes: int) -> Any:
    import torchvision.transforms.v2 as V

    if name == "MixUp":
        return V.MixUp(alpha=0.8, num_classes=num_classes)
    return V.CutMix(alpha=1.0, num_classes=num_classes)


def recipe() -> Any:
    """torchvision v2's classification recipe (module docstring), one object for every loader."""
    import torchvision.transforms.v2 as V

    return V.Compose([V.RandomResizedCrop(224), V.RandomHorizontalFlip(), V.ToImage(),
                      V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD)])


def factories(root: Path, *, batch_size: int, num_workers: int, seed: int = 0) -> dict[str, Callable[[], Any]]:
    """Loader name -> a callable building a fresh loader (module docstring)."""
    import warnings

    import torchvision
    from torch.utils.data import DataLoader, default_collate

    import gpufeed

    transform = recipe()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)  # the recipe must stay on the fast path
        ours = gpufeed.ImageFolder(root, transform=transform)
    theirs = torchvision.datasets.ImageFolder(str(root), transform=transform)
    num_classes = len(theirs.classes)

    def common() -> dict[str, Any]:
        return dict(batch_size=batch_size, num_workers=num_workers, shuffle=True,
                    generator=torch.Generator().manual_seed(seed))

    out: dict[str, Callable[[], Any]] = {"gpufeed": lambda: gpufeed.FastLoader(ours, **common(), seed=seed)}
    for name in OPS:
        op = make_op(name, num_classes)
        out[f"gpufeed {name}"] = (lambda op=op: gpufeed.FastLoader(ours, **common(), seed=seed, batch_transform=op))
        out[f"DataLoader {name}"] = (lambda op=op: DataLoader(
            theirs, **common(), collate_fn=lambda b: op(*default_collate(b))))
    return out


def pass_costs(batch_size: int, reps: int = 9) -> dict[str, float]:
    """ms per batch of batch_size x 3 x 224 x 224, one thread, median of ``reps`` interleaved
    runs: the dtype/normalize pass alone, with MixUp fused into it, CutMix pasted on uint8 then
    normalized, and normalize followed by a MixUp pass over the floats (torchvision's way)."""
    import statistics
    import time

    from gpufeed.image._batch_ops import CUTMIX, MIXUP, BatchOp, Mix, MixParams
    from gpufeed.image._normalize import affine, convert_

    torch.set_num_threads(1)
    images = torch.randint(0, 256, (batch_size, 3, 224, 224), dtype=torch.uint8)
    out = torch.empty(images.shape)
    constants = affine((MEAN, STD), torch.float32)
    mixup = BatchOp((Mix(MIXUP, 1.0),), (1.0,), 10)
    cutmix = BatchOp((Mix(CUTMIX, 1.0),), (1.0,), 10)
    runs: dict[str, Callable[[], Any]] = {
        "normalize": lambda: convert_(out, images, constants),
        "normalize + MixUp fused": lambda: mixup.convert(out, images, constants, MixParams(MIXUP, 0.3)),
        "CutMix on uint8 + normalize": lambda: cutmix.convert(out, images.clone(), constants,
                                                              MixParams(CUTMIX, 0.5, (40, 200, 30, 190))),
        "normalize, then MixUp pass": lambda: mixup.mix_(convert_(out, images, constants), MixParams(MIXUP, 0.3)),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: round(1000 * statistics.median(t), 2) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--images", type=int, default=480)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from gpufeed.cli.bench import prepare_demo_data, write
    from gpufeed.compare._compare import compare
    from gpufeed.compare._environment import describe_environment

    root = Path(args.root) if args.root else Path(prepare_demo_data("demo-mix", args.images)[0])
    env = describe_environment(args.workers)
    env["uptime_before"] = uptime()
    env["torchvision"] = __import__("torchvision").__version__
    made = factories(root, batch_size=args.batch_size, num_workers=args.workers)
    result = compare(made, num_rounds=args.rounds, environment=env, rotate=True)
    env["uptime_after"] = uptime()
    write(result.format_table())
    ratios: dict[str, Any] = {}
    write("\nop       vs gpufeed (goal >= 0.9x)   vs DataLoader + collate idiom (goal >= 2.0x)   per round")
    for name in OPS:
        ours = f"gpufeed {name}"
        own = result.ratio(ours, "gpufeed")
        idiom = result.ratio(ours, f"DataLoader {name}")
        rounds = [round(r, 2) for r in result.paired_ratios(ours, f"DataLoader {name}")]
        own_rounds = [round(r, 2) for r in result.paired_ratios(ours, "gpufeed")]
        ratios[name] = {"vs gpufeed": round(own, 2), "vs DataLoader": round(idiom, 2),
                        "per_round_vs_gpufeed": own_rounds, "per_round_vs_DataLoader": rounds}
        write(f"{name:<8} {own:>8.2f}x {own_rounds}   {idiom:>8.2f}x {rounds}")
    write(f"uptime before: {env['uptime_before']}\nuptime after:  {env['uptime_after']}")
    costs = pass_costs(args.batch_size)
    write(f"\nms per batch of {args.batch_size} x 3 x 224 x 224, one thread (the CutMix row includes a "
          "clone of the uint8 batch):")
    for name, ms in costs.items():
        write(f"  {name:<30} {ms:>7.2f}")
    if args.json:
        report = {"compare": result.to_dict(), "ratios": ratios, "pass_costs_ms": costs}
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
