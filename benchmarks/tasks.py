"""Training tasks beyond one image per sample: FastLoader against DataLoader with the same
pipelines, every loader in one run, alternating rounds (``compare(..., rotate=True)``), one table.

    PYTHONPATH=$PWD python -m benchmarks.tasks [ROOT] [--images 2000] [--workers 2]
        [--batch-size 64] [--batches 12] [--rounds 3] [--recipes dino_2x224_6x96,...] [--json OUT]

Recipes (``--recipes``, default all; :data:`RECIPES`, name -> builder of the two loaders):

- ``dino_2x224_6x96``: DINO's multi-crop, torchvision v2 views: 2 x RandomResizedCrop(224,
  scale=(0.4, 1)) + 6 x RandomResizedCrop(96, scale=(0.05, 0.4)), each with a flip,
  ColorJitter(0.4, 0.4, 0.2, 0.1) (p=0.8), RandomGrayscale(0.2), GaussianBlur (p=1.0 / 0.1 on the
  global views, 0.5 on the local ones), ToImage, ToDtype(float32), Normalize. DataLoader: a
  torchvision ``ImageFolder`` whose transform returns the list of the views (as DINO's
  ``DataAugmentationDINO`` does); FastLoader: ``gpufeed.MultiView`` of the same pipelines;
- ``simclr_2x224``: SimCLR's two views: RandomResizedCrop(224), flip, ColorJitter(0.8, 0.8,
  0.8, 0.2) (p=0.8), RandomGrayscale(0.2), GaussianBlur(23) (p=0.5), ToImage, ToDtype(float32),
  Normalize; the same two ways.

A builder takes (root, batch_size, num_workers, seed) and returns ("<recipe> DataLoader",
"<recipe> gpufeed") factories; a row of another kind (a batch op, say) adds a builder. Needs
torchvision (the ``.venv-tv`` environment). Without ROOT, ./demo-augment (photo-like JPEGs of
~400x350, ``gpufeed.synth``) is made once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

Factories = dict[str, Callable[[], Any]]
#: (DataLoader factory, FastLoader factory) of one recipe
Pair = tuple[Callable[[], Any], Callable[[], Any]]


class Views:
    """A transform returning the list of its pipelines' results (DINO's
    ``DataAugmentationDINO``, SimCLR's view generator): what DataLoader runs."""

    def __init__(self, pipelines: Sequence[Any]) -> None:
        self.pipelines = list(pipelines)

    def __call__(self, image: Any) -> list[Any]:
        return [pipeline(image) for pipeline in self.pipelines]


def _view(size: int, scale: tuple[float, float], jitter: tuple[float, ...], blur_kernel: int,
          blur_p: float) -> Any:
    import torchvision.transforms.v2 as V

    return V.Compose([
        V.RandomResizedCrop(size, scale=scale, interpolation=V.InterpolationMode.BICUBIC),
        V.RandomHorizontalFlip(p=0.5),
        V.RandomApply([V.ColorJitter(*jitter)], p=0.8),
        V.RandomGrayscale(p=0.2),
        V.RandomApply([V.GaussianBlur(kernel_size=blur_kernel, sigma=(0.1, 2.0))], p=blur_p),
        V.ToImage(), V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD),
    ])


def dino_views() -> list[Any]:
    """DINO's 2 global + 6 local views (module docstring)."""
    jitter = (0.4, 0.4, 0.2, 0.1)
    local = _view(96, (0.05, 0.4), jitter, 9, 0.5)
    return [_view(224, (0.4, 1.0), jitter, 23, 1.0), _view(224, (0.4, 1.0), jitter, 23, 0.1)] + [local] * 6


def simclr_views() -> list[Any]:
    """SimCLR's two views (module docstring)."""
    view = _view(224, (0.08, 1.0), (0.8, 0.8, 0.8, 0.2), 23, 0.5)
    return [view, view]


def multi_view_builder(make_views: Callable[[], list[Any]]) -> Callable[..., Pair]:
    """A builder of the two loaders of a multi-view recipe: DataLoader over torchvision's
    ImageFolder with :class:`Views`, FastLoader over gpufeed's with ``MultiView``."""

    def build(root: Path, *, batch_size: int, num_workers: int, seed: int) -> Pair:
        import warnings

        import torchvision
        from torch.utils.data import DataLoader

        import gpufeed

        pipelines = make_views()
        with warnings.catch_warnings():
            warnings.simplefilter("error", gpufeed.GpufeedWarning)  # a recipe must stay fast
            ours = gpufeed.ImageFolder(root, transform=gpufeed.MultiView(pipelines))
        theirs = torchvision.datasets.ImageFolder(str(root), transform=Views(pipelines))

        def common() -> dict[str, Any]:
            return dict(batch_size=batch_size, num_workers=num_workers, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))

        return (lambda: DataLoader(theirs, **common()),
                lambda: gpufeed.FastLoader(ours, **common(), seed=seed))

    return build


#: recipe name -> builder(root, *, batch_size, num_workers, seed) -> (DataLoader, FastLoader) factories
RECIPES: dict[str, Callable[..., Pair]] = {
    "dino_2x224_6x96": multi_view_builder(dino_views),
    "simclr_2x224": multi_view_builder(simclr_views),
}


def factories(root: Path, recipes: list[str], *, batch_size: int, num_workers: int,
              seed: int = 0) -> Factories:
    """"<recipe> DataLoader" / "<recipe> gpufeed" -> a callable building a fresh loader."""
    out: Factories = {}
    for name in recipes:
        if name not in RECIPES:
            raise ValueError(f"`recipes` must name recipes of {sorted(RECIPES)}. Found: {name!r}.")
        theirs, ours = RECIPES[name](root, batch_size=batch_size, num_workers=num_workers, seed=seed)
        out[f"{name} DataLoader"] = theirs
        out[f"{name} gpufeed"] = ours
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from gpufeed.cli.bench import prepare_demo_data, write
    from gpufeed.compare._compare import compare
    from gpufeed.compare._environment import describe_environment

    recipes = [r for r in args.recipes.split(",") if r]
    root = Path(args.root) if args.root else prepare_demo_data("demo-augment", args.images)[0]
    env = describe_environment(args.workers)
    env["load_average"] = list(os.getloadavg())
    env["torchvision"] = __import__("torchvision").__version__
    made = factories(root, recipes, batch_size=args.batch_size, num_workers=args.workers)
    result = compare(made, num_batches=args.batches, num_rounds=args.rounds, environment=env,
                     rotate=True)
    write(result.format_table())
    summary: dict[str, Any] = {}
    write("\nrecipe             images/s DataLoader  images/s gpufeed  ratio  per round (same round)")
    for name in recipes:
        theirs, ours = f"{name} DataLoader", f"{name} gpufeed"
        ratio = result.ratio(ours, theirs)
        paired = [round(r, 2) for r in result.paired_ratios(ours, theirs)]
        summary[name] = {"ratio": round(ratio, 2), "paired": paired,
                         "peak_pss_ratio": round(result.memory_ratio(ours, theirs), 2)}
        write(f"{name:<18} {result.summary(theirs).median_samples_per_s:>19.0f} "
              f"{result.summary(ours).median_samples_per_s:>17.0f} {ratio:>5.2f}x  {paired}")
    env["load_average_after"] = list(os.getloadavg())
    write(f"load average before/after: {env['load_average']} / {env['load_average_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"compare": result.to_dict(), "ratios": summary},
                                              indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
