"""Training recipes with augmentations: ``gpufeed.ImageFolder(root, transform=recipe)`` in
``FastLoader`` against ``torchvision.datasets.ImageFolder(root, transform=recipe)`` in
``DataLoader``, the same recipe object, in one run, alternating rounds (see benchmarks/README.md).

    PYTHONPATH=$PWD python -m benchmarks.augment [ROOT] [--images 2000] [--workers 2]
        [--batch-size 64] [--batches 12] [--rounds 3] [--recipes rrc_flip,timm,...] [--json OUT]

Recipes (``--recipes``, default all):

- ``rrc_flip``: RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor (uint8);
- ``timm``: ``timm.data.create_transform(224, is_training=True)``;
- ``tv_v2``: torchvision's v2 recipe: RandomResizedCrop + flip + TrivialAugmentWide + ToImage +
  ToDtype(float32, scale=True) + Normalize + RandomErasing(0.1);
- ``randaugment``: RandomResizedCrop + flip + RandAugment(2, 9) + ToTensor + Normalize;
- ``tensor_op``: RandomResizedCrop + flip + PILToTensor + a user's ``nn.Module`` on uint8
  tensors (:class:`ChannelMix`) + ConvertImageDtype(float32) + Normalize;
- ``timm_3a``: DeiT III's ``timm.data.create_transform(224, is_training=True, auto_augment="3a")``
  (timm's "3a" AutoAugment, then ColorJitter(0.4)).
- ``augmix_timm``: ``timm.data.create_transform(224, is_training=True,
  auto_augment="augmix-m5-w4-d2")``;
- ``augmix_tv``: RandomResizedCrop + flip + v2 ``AugMix()`` + ToImage + ToDtype(float32,
  scale=True) + Normalize.

Then per-op costs: each augmentation op of the recipes as the original runs it (on a 224x224 PIL
image, or the tensor it gets) against what gpufeed runs for it on a 224x224 row
(``gpufeed.explain`` says which), one thread, median of many calls. Needs torchvision and timm
(the ``.venv-tv`` environment). Without ROOT, ./demo-augment (photo-like JPEGs of ~400x350,
``gpufeed.synth``) is made once and reused.

Private import: ``gpufeed.image.augment._base.row_rng``, the per-row draw whose cost it
measures apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
RECIPES = ("rrc_flip", "timm", "tv_v2", "randaugment", "tensor_op", "timm_3a", "augmix_timm",
           "augmix_tv")


class ChannelMix(torch.nn.Module):
    """A user's op on uint8 (3, H, W) tensors that gpufeed does not know: a fixed colour mix
    (a sepia-like matrix), done in float and rounded back to uint8."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("matrix", torch.tensor([[0.70, 0.25, 0.05], [0.10, 0.80, 0.10],
                                                     [0.05, 0.15, 0.80]]))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        mixed = torch.einsum("ij,jhw->ihw", self.matrix, image.float())
        return mixed.round_().clamp_(0, 255).to(torch.uint8)


def make_recipe(name: str) -> Any:
    """The recipe ``name`` (module docstring), a fresh torchvision/timm object."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as V

    if name == "rrc_flip":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    if name == "timm":
        from timm.data import create_transform

        return create_transform(224, is_training=True)
    if name == "tv_v2":
        return V.Compose([V.RandomResizedCrop(224), V.RandomHorizontalFlip(),
                          V.TrivialAugmentWide(), V.ToImage(),
                          V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD),
                          V.RandomErasing(0.1)])
    if name == "randaugment":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                          T.RandAugment(2, 9), T.ToTensor(), T.Normalize(MEAN, STD)])
    if name == "tensor_op":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor(),
                          ChannelMix(), T.ConvertImageDtype(torch.float32),
                          T.Normalize(MEAN, STD)])
    if name == "timm_3a":
        from timm.data import create_transform

        return create_transform(224, is_training=True, auto_augment="3a")
    if name == "augmix_timm":
        from timm.data import create_transform

        return create_transform(224, is_training=True, auto_augment="augmix-m5-w4-d2")
    if name == "augmix_tv":
        return V.Compose([V.RandomResizedCrop(224), V.RandomHorizontalFlip(), V.AugMix(),
                          V.ToImage(), V.ToDtype(torch.float32, scale=True),
                          V.Normalize(MEAN, STD)])
    raise ValueError(f"`recipe` must be one of {RECIPES}. Found: {name!r}.")


def factories(root: Path, recipes: list[str], *, batch_size: int, num_workers: int,
              seed: int = 0) -> dict[str, Callable[[], Any]]:
    """"<recipe> gpufeed" / "<recipe> DataLoader" -> a callable building a fresh loader."""
    import warnings

    import torchvision
    from torch.utils.data import DataLoader

    import gpufeed

    out: dict[str, Callable[[], Any]] = {}
    for name in recipes:
        recipe = make_recipe(name)
        with warnings.catch_warnings():
            warnings.simplefilter("error", gpufeed.GpufeedWarning)  # a recipe must stay fast
            ours = gpufeed.ImageFolder(root, transform=recipe)
        theirs = torchvision.datasets.ImageFolder(str(root), transform=recipe)

        def common() -> dict[str, Any]:
            return dict(batch_size=batch_size, num_workers=num_workers, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))

        out[f"{name} DataLoader"] = (lambda ds=theirs: DataLoader(ds, **common()))
        out[f"{name} gpufeed"] = (lambda ds=ours: gpufeed.FastLoader(ds, **common(), seed=seed))
    return out


def _median_s(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_costs(recipes: list[str], calls: int = 200) -> list[dict[str, Any]]:
    """Per augmentation op: the original's ms per call against gpufeed's op on a 224x224 row."""
    from PIL import Image

    import gpufeed
    from gpufeed.image.augment._base import row_rng
    from gpufeed.synth import photo_like

    torch.set_num_threads(1)
    row = np.ascontiguousarray(photo_like(224, 224, seed=1))
    pil = Image.fromarray(row, "RGB")
    uint8 = torch.from_numpy(row).permute(2, 0, 1).contiguous()
    normalized = (uint8.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    rows: list[dict[str, Any]] = []
    for name in recipes:
        recipe = make_recipe(name)
        pipe = gpufeed.from_torchvision(recipe)
        placed = [r for r in pipe.routes if r.place in ("tensor", "float")
                  or r.note.startswith("gpufeed.image.augment")]
        ours = [*pipe.ops, *pipe.float_ops]
        originals = [op for op in recipe.transforms
                     if any(r.op.startswith(type(op).__name__) for r in placed)]
        tensor_seen = False
        for op in recipe.transforms:
            kind = type(op).__name__
            tensor_seen = tensor_seen or kind in ("ToTensor", "PILToTensor", "ToImage",
                                                  "MaybeToTensor", "Normalize")
            if op not in originals:
                continue
            k = originals.index(op)
            route, gop = placed[k], ours[k]
            given = normalized if route.place == "float" or kind == "RandomErasing" else (
                uint8 if tensor_seen else pil)
            rng = row_rng(0, 0, 0)
            target = normalized.clone() if route.place == "float" or kind == "RandomErasing" else row.copy()
            theirs_ms = 1000 * _median_s(lambda op=op, x=given: op(x), calls)
            ours_ms = 1000 * _median_s(lambda g=gop, t=target, r=rng: g.apply(t, g.draw(r, 224, 224)), calls)
            rows.append({"recipe": name, "op": route.op, "where": route.place,
                         "original_on": "PIL" if given is pil else "tensor",
                         "original_ms": round(theirs_ms, 3), "gpufeed_ms": round(ours_ms, 3),
                         "speedup": round(theirs_ms / ours_ms, 2) if ours_ms else None})
    return rows


def _demo_root(images: int) -> Path:
    from gpufeed.cli.bench import prepare_demo_data

    root, _, _ = prepare_demo_data("demo-augment", images)
    return Path(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--op-calls", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from gpufeed.cli.bench import write
    from gpufeed.compare._compare import compare
    from gpufeed.compare._environment import describe_environment

    recipes = [r for r in args.recipes.split(",") if r]
    root = Path(args.root) if args.root else _demo_root(args.images)
    env = describe_environment(args.workers)
    env["load_average"] = list(__import__("os").getloadavg())
    env["timm"] = __import__("timm").__version__
    env["torchvision"] = __import__("torchvision").__version__
    made = factories(root, recipes, batch_size=args.batch_size, num_workers=args.workers)
    result = compare(made, num_batches=args.batches, num_rounds=args.rounds, environment=env)
    write(result.format_table())
    summary, paired = {}, {}
    for name in recipes:
        summary[name] = round(result.ratio(f"{name} gpufeed", f"{name} DataLoader"), 2)
        paired[name] = [round(r, 2) for r in
                         result.paired_ratios(f"{name} gpufeed", f"{name} DataLoader")]
    base = summary.get("rrc_flip")
    write("\nrecipe        gpufeed / DataLoader (medians)  vs rrc_flip's ratio  per round (back to back)")
    for name, ratio in summary.items():
        rel = f"{ratio / base:.2f}" if base else "-"
        write(f"{name:<16} {ratio:>8.2f}x {rel:>28}   {paired[name]}")
    costs = op_costs(recipes, args.op_calls)
    write("\nper-op cost, ms per 224x224 image (one thread): original vs gpufeed")
    for c in costs:
        write(f"{c['recipe']:<12} {c['where']:<6} {c['op'][:58]:<58} {c['original_on']:<6} "
              f"{c['original_ms']:>7.3f} {c['gpufeed_ms']:>7.3f} {c['speedup']}x")
    env["load_average_after"] = list(__import__("os").getloadavg())
    write(f"load average before/after: {env['load_average']} / {env['load_average_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"compare": result.to_dict(), "ratios": summary, "paired": paired,
                                               "op_costs": costs}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
