"""Training tasks beyond one image and one int label per sample: FastLoader against its peer
with the same pipelines and data, every loader in one run, alternating rounds
(``compare(..., rotate=True)``), one table of rows, each a ratio against its target.

    PYTHONPATH=$PWD python -m benchmarks.tasks [ROOT] [--images 2000] [--workers 2]
        [--batch-size 64] [--batches 12] [--rounds 3] [--recipes caption_tar,...] [--json OUT]

Recipes (``--recipes``, default all; :data:`RECIPES`, name -> builder of its loaders and rows):

- ``dino_2x224_6x96``: DINO's multi-crop, torchvision v2 views: 2 x RandomResizedCrop(224,
  scale=(0.4, 1)) + 6 x RandomResizedCrop(96, scale=(0.05, 0.4)), each with a flip,
  ColorJitter(0.4, 0.4, 0.2, 0.1) (p=0.8), RandomGrayscale(0.2), GaussianBlur (p=1.0 / 0.1 on the
  global views, 0.5 on the local ones), ToImage, ToDtype(float32), Normalize. DataLoader: a
  torchvision ``ImageFolder`` whose transform returns the list of the views (as DINO's
  ``DataAugmentationDINO`` does); FastLoader: ``gpufeed.MultiView`` of the same pipelines;
- ``simclr_2x224``: SimCLR's two views: RandomResizedCrop(224), flip, ColorJitter(0.8, 0.8,
  0.8, 0.2) (p=0.8), RandomGrayscale(0.2), GaussianBlur(23) (p=0.5), ToImage, ToDtype(float32),
  Normalize; the same two ways.

The other recipes use ``benchmarks/mix.py``'s classification recipe (RandomResizedCrop(224),
flip, ToImage, ToDtype(float32), Normalize; one torchvision v2 object per loader):

- ``caption_tar``: CLIP-style samples, a ``.jpg`` and a ``.txt`` caption each, in tar shards
  written from ROOT (each sample also has a ``.cls``): ``FastLoader(TarShards(shards,
  label="txt"))`` against webdataset's own pipeline, ``wds.WebDataset(shards).decode("pil")
  .to_tuple("jpg", "txt").map_tuple(recipe, identity)`` in torch's ``DataLoader``, and against
  ``FastLoader(TarShards(shards))`` (the int ``.cls`` labels of the same shards);
- ``dict_target``: ``gpufeed.ImageFolder(root, target_transform=`` :func:`dict_target` ``)``
  (``{"label": y, "weight": 1.0}`` per sample) against the same loader with its int labels;
- ``multi_label``: a float32 multi-hot tensor of :data:`MULTI_LABEL_CLASSES` per sample (its
  folder's class and up to 3 others, seeded): ``gpufeed.ImageDataset`` of the (path, tensor)
  pairs against DataLoader over the same pairs read with PIL (:class:`PathTargets`);
- ``mixup`` / ``cutmix``: ``benchmarks/mix.py``'s loaders: the batch op as ``FastLoader(
  batch_transform=...)`` against the same FastLoader without it and against DataLoader with
  ``collate_fn=lambda b: op(*default_collate(b))``.

Detection and segmentation (COCO boxes / masks, image + mask pairs; torchvision v2 and
Albumentations peers) have data of their own: ``benchmarks/detection.py`` (same table and rules,
its rows' goals in ``_goals.DETECTION_GOALS``), per-op costs in ``benchmarks/detection_ops.py``.

FastLoaders and map-style DataLoaders shuffle (generators seeded alike); webdataset's pipeline
reads its shards in order (no ``.shuffle``), its two workers a shard at a time each. A row's
status follows ``benchmarks/_goals.py``: "met", "NOT met", or "inconclusive" when the ratio of
medians and the median per-round ratio fall on different sides of the target. Needs torchvision
and, for ``caption_tar``, webdataset (the ``.venv-tv`` environment). Without ROOT,
./demo-augment (photo-like JPEGs of ~400x350, ``gpufeed.synth``) is made once and reused; the
shards are written once next to it (ROOT-caption-shards).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import mix
from benchmarks._common import uptime
from benchmarks._goals import speed_goal

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
MULTI_LABEL_CLASSES = 80
NUM_SHARDS = 4  # webdataset's DataLoader workers take whole shards: at least one each

Factories = dict[str, Callable[[], Any]]


@dataclass(frozen=True)
class Row:
    """A row of the table: loader ``ours`` against loader ``peer`` (images/s, one run), to reach
    ``target`` (None: none stated)."""

    name: str
    ours: str
    peer: str
    target: float | None = None


@dataclass(frozen=True)
class Task:
    """What a recipe's builder returns: its loaders (name -> a callable building a fresh one;
    a name two recipes share is one loader, built the same way) and its rows."""

    loaders: Factories
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Data:
    """The data every loader reads: an image folder and the same images as tar shards (a
    ``.jpg``, ``.cls`` and ``.txt`` caption per sample)."""

    root: Path
    shards: tuple[str, ...]


def _common(batch_size: int, num_workers: int, seed: int) -> dict[str, Any]:
    return dict(batch_size=batch_size, num_workers=num_workers, shuffle=True,
                generator=torch.Generator().manual_seed(seed))


def _fast_path(make: Callable[[], Any]) -> Any:
    """``make()`` with gpufeed's warnings as errors: a recipe must stay on the fast path."""
    import warnings

    import gpufeed

    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        return make()


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


def multi_view_builder(make_views: Callable[[], list[Any]], name: str,
                       target: float | None) -> Callable[..., Task]:
    """A builder of a multi-view recipe: DataLoader over torchvision's ImageFolder with
    :class:`Views`, FastLoader over gpufeed's with ``MultiView``; one row, against ``target``."""

    def build(data: Data, *, batch_size: int, num_workers: int, seed: int) -> Task:
        import torchvision
        from torch.utils.data import DataLoader

        import gpufeed

        pipelines = make_views()
        ours = _fast_path(lambda: gpufeed.ImageFolder(data.root, transform=gpufeed.MultiView(pipelines)))
        theirs = torchvision.datasets.ImageFolder(str(data.root), transform=Views(pipelines))
        common = lambda: _common(batch_size, num_workers, seed)  # noqa: E731 - a fresh generator per loader
        loaders = {f"{name} DataLoader": lambda: DataLoader(theirs, **common()),
                   f"{name} gpufeed": lambda: gpufeed.FastLoader(ours, **common(), seed=seed)}
        return Task(loaders, (Row(f"{name} vs DataLoader", f"{name} gpufeed", f"{name} DataLoader", target),))

    return build


# -- targets beyond an int label ------------------------------------------------------------

#: the FastLoader with the int labels of the folder: the peer of dict_target and of the batch ops
INT_LABELS = "ImageFolder int labels gpufeed"


def caption(class_name: str, index: int) -> str:
    """The caption of sample ``index`` of class ``class_name`` in the shards."""
    return f"a photo of a {class_name}, picture {index}, taken on a quiet afternoon"


def write_caption_shards(root: Path, out: Path, num_shards: int = NUM_SHARDS) -> tuple[str, ...]:
    """The images of the folder ``root`` as ``num_shards`` tar shards in ``out``, written once
    (rewritten when the folder's count or ``num_shards`` changed):
    members ``%06d.jpg``, ``%06d.cls`` (the class index) and ``%06d.txt`` (:func:`caption`)."""
    import gpufeed

    folder = gpufeed.ImageFolder(root)
    samples, classes = folder.samples, folder.classes
    paths = [out / f"caption-{k:06d}.tar" for k in range(num_shards)]
    done = out / "done"  # "N in K": samples and shards, written once every shard is complete
    if done.exists() and done.read_text() == f"{len(samples)} in {num_shards}":
        return tuple(str(p) for p in paths)
    out.mkdir(parents=True, exist_ok=True)
    done.unlink(missing_ok=True)
    for k, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(k, len(samples), num_shards):
                image, label = samples[i]
                members = {"jpg": Path(image).read_bytes(), "cls": str(label).encode(),
                           "txt": caption(classes[label], i).encode()}
                for ext, blob in members.items():
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size, info.mode = len(blob), 0o444
                    tar.addfile(info, io.BytesIO(blob))
    done.write_text(f"{len(samples)} in {num_shards}")
    return tuple(str(p) for p in paths)


def identity(x: Any) -> Any:
    return x


def caption_tar(data: Data, *, batch_size: int, num_workers: int, seed: int) -> Task:
    """CLIP-style image + caption from tar shards (module docstring)."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    import gpufeed

    captions = _fast_path(lambda: gpufeed.TarShards(list(data.shards), transform=mix.recipe(), label="txt"))
    labels = _fast_path(lambda: gpufeed.TarShards(list(data.shards), transform=mix.recipe()))
    transform = mix.recipe()

    def webdataset() -> DataLoader:
        pipe = (wds.WebDataset(list(data.shards), shardshuffle=False).decode("pil")
                .to_tuple("jpg", "txt").map_tuple(transform, identity))
        return DataLoader(pipe, batch_size=batch_size, num_workers=num_workers)

    common = lambda: _common(batch_size, num_workers, seed)  # noqa: E731
    loaders = {"caption TarShards gpufeed": lambda: gpufeed.FastLoader(captions, **common(), seed=seed),
               "caption webdataset DataLoader": webdataset,
               "int-label TarShards gpufeed": lambda: gpufeed.FastLoader(labels, **common(), seed=seed)}
    return Task(loaders, (
        Row("caption (tar) vs webdataset + DataLoader", "caption TarShards gpufeed",
            "caption webdataset DataLoader", 2.5),
        Row("caption (tar) vs the shards' int labels", "caption TarShards gpufeed",
            "int-label TarShards gpufeed", 0.9),
    ))


def dict_target(label: int) -> dict[str, Any]:
    """A dict target made in the workers: ``{"label": label, "weight": 1.0}``."""
    return {"label": label, "weight": 1.0}


def _int_labels(data: Data, batch_size: int, num_workers: int, seed: int) -> Factories:
    """mix.py's loaders, named for this table: :data:`INT_LABELS` (FastLoader without a batch op)
    and "<op> gpufeed" / "<op> DataLoader"."""
    made = mix.factories(data.root, batch_size=batch_size, num_workers=num_workers, seed=seed)
    out = {INT_LABELS: made["gpufeed"]}
    for op in mix.OPS:
        out[f"{op} gpufeed"] = made[f"gpufeed {op}"]
        out[f"{op} DataLoader"] = made[f"DataLoader {op}"]
    return out


def dict_targets(data: Data, *, batch_size: int, num_workers: int, seed: int) -> Task:
    """A dict target through ``target_transform`` vs the same loader's int labels."""
    import gpufeed

    ours = _fast_path(lambda: gpufeed.ImageFolder(data.root, transform=mix.recipe(), target_transform=dict_target))
    common = lambda: _common(batch_size, num_workers, seed)  # noqa: E731
    loaders = {"dict target gpufeed": lambda: gpufeed.FastLoader(ours, **common(), seed=seed),
               INT_LABELS: _int_labels(data, batch_size, num_workers, seed)[INT_LABELS]}
    return Task(loaders, (Row("dict target_transform vs int labels", "dict target gpufeed", INT_LABELS, 0.9),))


class PathTargets(torch.utils.data.Dataset):
    """(path, target) pairs, each image read with PIL (torchvision's ``default_loader``) and
    passed through ``transform``: DataLoader's side of the multi-label row, as torchvision's
    ``ImageFolder`` would read them."""

    def __init__(self, samples: list[tuple[str, Any]], transform: Any) -> None:
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from torchvision.datasets.folder import default_loader

        path, target = self.samples[index]
        return self.transform(default_loader(path)), target


def multi_hot_samples(root: Path, num_classes: int = MULTI_LABEL_CLASSES, seed: int = 0) -> list[tuple[str, Any]]:
    """(path, float32 [num_classes] multi-hot) per image of ``root``: its folder's class and up
    to 3 others drawn from a generator seeded with ``seed``."""
    import gpufeed

    g = torch.Generator().manual_seed(seed)
    out = []
    for path, label in gpufeed.ImageFolder(root).samples:
        target = torch.zeros(num_classes)
        target[label % num_classes] = 1.0
        extra = int(torch.randint(0, 4, (), generator=g))
        target[torch.randint(0, num_classes, (extra,), generator=g)] = 1.0
        out.append((path, target))
    return out


def multi_label(data: Data, *, batch_size: int, num_workers: int, seed: int) -> Task:
    """Multi-hot float targets from a samples list, FastLoader vs DataLoader."""
    from torch.utils.data import DataLoader

    import gpufeed

    samples = multi_hot_samples(data.root)
    ours = _fast_path(lambda: gpufeed.ImageDataset(samples, transform=mix.recipe()))
    theirs = PathTargets(samples, mix.recipe())
    common = lambda: _common(batch_size, num_workers, seed)  # noqa: E731
    loaders = {"multi-label gpufeed": lambda: gpufeed.FastLoader(ours, **common(), seed=seed),
               "multi-label DataLoader": lambda: DataLoader(theirs, **common())}
    return Task(loaders, (Row(f"multi-label [{MULTI_LABEL_CLASSES}] vs DataLoader", "multi-label gpufeed",
                              "multi-label DataLoader", 2.0),))


def batch_op_builder(op: str) -> Callable[..., Task]:
    """A builder of ``benchmarks/mix.py``'s rows for ``op``: vs the same FastLoader without it,
    vs DataLoader with the collate idiom (targets: ``mix.GOALS``)."""

    def build(data: Data, *, batch_size: int, num_workers: int, seed: int) -> Task:
        made = _int_labels(data, batch_size, num_workers, seed)
        names = (INT_LABELS, f"{op} gpufeed", f"{op} DataLoader")
        return Task({n: made[n] for n in names}, (
            Row(f"{op} batch_transform vs without", f"{op} gpufeed", INT_LABELS, mix.GOALS["vs gpufeed"]),
            Row(f"{op} vs DataLoader + collate idiom", f"{op} gpufeed", f"{op} DataLoader",
                mix.GOALS["vs DataLoader"]),
        ))

    return build


#: recipe name -> builder(data, *, batch_size, num_workers, seed) -> Task
RECIPES: dict[str, Callable[..., Task]] = {
    "dino_2x224_6x96": multi_view_builder(dino_views, "dino_2x224_6x96", 2.5),
    "simclr_2x224": multi_view_builder(simclr_views, "simclr_2x224", None),
    "caption_tar": caption_tar,
    "dict_target": dict_targets,
    "multi_label": multi_label,
    "mixup": batch_op_builder("MixUp"),
    "cutmix": batch_op_builder("CutMix"),
}


def build(data: Data, recipes: list[str], *, batch_size: int, num_workers: int,
          seed: int = 0) -> Task:
    """The loaders and rows of ``recipes``, one table (a loader two recipes share runs once)."""
    loaders: Factories = {}
    rows: list[Row] = []
    for name in recipes:
        if name not in RECIPES:
            raise ValueError(f"`recipes` must name recipes of {sorted(RECIPES)}. Found: {name!r}.")
        task = RECIPES[name](data, batch_size=batch_size, num_workers=num_workers, seed=seed)
        for loader, make in task.loaders.items():
            loaders.setdefault(loader, make)
        rows.extend(task.rows)
    return Task(loaders, tuple(rows))


def row_report(result: Any, row: Row) -> dict[str, Any]:
    """A row's figures and status: ``speed_goal``'s rule (``benchmarks/_goals.py``); with no
    target, status "no target"."""
    ratio = result.ratio(row.ours, row.peer)
    paired = [round(r, 2) for r in result.paired_ratios(row.ours, row.peer)]
    report = {"ours_images_per_s": result.summary(row.ours).median_samples_per_s,
              "peer_images_per_s": result.summary(row.peer).median_samples_per_s,
              "ratio": round(ratio, 2), "paired": paired, "target": row.target, "status": "no target",
              "detail": ""}
    if row.target is not None:
        goal = speed_goal(result, row.ours, row.peer, row.target, row.name)
        report.update(status=goal.status, detail=goal.detail)
    return report


def format_rows(rows: Sequence[Row], reports: Sequence[dict[str, Any]]) -> list[str]:
    w = max(len("row"), *(len(r.name) for r in rows))
    lines = [f"{'row':<{w}}  {'img/s':>6} {'peer':>6} {'ratio':>6}  {'target':>7}  {'status':<12} per round"]
    for row, rep in zip(rows, reports):
        target = "-" if row.target is None else f">={row.target:.1f}x"
        lines.append(f"{row.name:<{w}}  {rep['ours_images_per_s']:>6.0f} {rep['peer_images_per_s']:>6.0f} "
                     f"{rep['ratio']:>5.2f}x  {target:>7}  {rep['status']:<12} {rep['paired']}")
    return lines


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
    shards = (write_caption_shards(root, root.parent / f"{root.name}-caption-shards")
              if "caption_tar" in recipes else ())
    env = describe_environment(args.workers)
    env["uptime_before"] = uptime()
    env["torchvision"] = __import__("torchvision").__version__
    if "caption_tar" in recipes:
        env["webdataset"] = __import__("webdataset").__version__
    task = build(Data(root, shards), recipes, batch_size=args.batch_size, num_workers=args.workers)
    result = compare(task.loaders, num_batches=args.batches, num_rounds=args.rounds, environment=env,
                     rotate=True)
    env["uptime_after"] = uptime()
    write(result.format_table())
    reports = [row_report(result, row) for row in task.rows]
    write("")
    for line in format_rows(task.rows, reports):
        write(line)
    for row, rep in zip(task.rows, reports):
        if rep["status"] not in ("met", "no target"):
            write(f"  {row.name}: {rep['status']} ({rep['detail']})")
    write(f"uptime before: {env['uptime_before']}\nuptime after:  {env['uptime_after']}")
    if args.json:
        out = {"compare": result.to_dict(), "uptime_after": env["uptime_after"],
               "rows": {row.name: rep for row, rep in zip(task.rows, reports)}}
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
