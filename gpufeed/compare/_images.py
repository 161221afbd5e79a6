"""End-to-end image loading: the pipelines people use today against FastLoader, on the same
images, with the same geometry and the same output, measured in one alternating run.

Three loaders, each yielding ``(images, labels)``: images uint8 ``[N, 3, H, W]``, labels int64 ``[N]``:

``DataLoader+PIL``
    ``torch.utils.data.DataLoader`` over :class:`PILImageFolder`, what torchvision's
    ``ImageFolder`` with ``Resize(256), CenterCrop(224), PILToTensor()`` (eval) or
    ``RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor()`` (train) does, written with
    PIL directly (torchvision is not a dependency): ``Image.open(f).convert("RGB")``, bilinear
    resampling with PIL's antialiasing, ``np.array`` (a copy, as ``pil_to_tensor``) and
    ``permute(2, 0, 1)``.
``DataLoader+OpenCV``
    ``DataLoader`` over :class:`OpenCVImageFolder`: ``cv2.imdecode`` + ``cvtColor`` to RGB, the
    same crop boxes, ``cv2.resize`` (``INTER_AREA`` for shrinks of 2x or more, else
    ``INTER_LINEAR``: the rule gpufeed's ``interpolation="auto"`` uses), ``cv2.flip``.
``FastLoader``
    ``FastLoader(ImageFolder(root, transform=ResizeCenterCrop(224, 256) | RandomResizedCrop(224)))``.
    With ``outputs`` (:class:`Output`), one FastLoader per output format instead, e.g.
    ``FastLoader channels_last float16`` (float outputs are normalized with ImageNet's mean and
    std), each compared with NCHW float32's images/s (:data:`LAYOUT_REFERENCE`).

Same geometry: eval boxes are torchvision's (shorter side to ``resize``, then the centre crop,
offsets ``int(round((h - th) / 2))``); train boxes come from
:meth:`gpufeed.image.RandomResizedCrop.params` with the same seed, epoch 0 (each round builds
a fresh loader) and sample index, so every pipeline crops and flips sample *i* identically. Same
sampling: equal ``batch_size``/``num_workers``, ``shuffle`` off (eval) or on (train) with a
generator seeded alike, ``persistent_workers=False`` so worker start-up is paid every round
(and reported apart, as ``startup``).

OpenCV's thread pool is set to one thread for the whole run (:func:`single_threaded_cv2`), as
OpenCV-based training scripts do (``cv2.setNumThreads``) and as FastLoader does for its workers:
two workers on two cores, each with its own thread pool, would oversubscribe the machine, and a
forked child can hang in a pool its parent had started.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from gpufeed._engine.signals import ignore_sigint
from gpufeed._observe.memory import PeakPSS, tree_memory
from gpufeed.compare._compare import CompareResult, LoaderFactory, compare, stop_workers, touch_pages
from gpufeed.compare._environment import describe_environment, package_version
from gpufeed.compare._references import OpenCVImageFolder, PILImageFolder, _ReferenceFolder
from gpufeed.decoders import backends
from gpufeed.errors import shorten
from gpufeed.image._cv2threads import single_threaded_cv2 as _single_threaded_cv2
from gpufeed.image._transforms import ImageTransform, RandomResizedCrop, ResizeCenterCrop
from gpufeed.loader import FastLoader
from gpufeed.sources import ImageFolder

__all__ = [
    "CV_NAME",
    "DTYPES",
    "FAST_NAME",
    "IMAGENET_NORMALIZE",
    "LAYOUT_REFERENCE",
    "PIL_NAME",
    "TRANSFORMS",
    "describe_geometry",
    "Flatness",
    "ImageBenchResult",
    "OpenCVImageFolder",
    "Output",
    "PILImageFolder",
    "image_environment",
    "loader_factories",
    "make_transform",
    "measure_flatness",
    "pil_available",
    "run_image_bench",
    "single_threaded_cv2",
]

PIL_NAME = "DataLoader+PIL"
CV_NAME = "DataLoader+OpenCV"
FAST_NAME = "FastLoader"
TRANSFORMS = ("eval", "train")
IMAGENET_NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
DTYPES = {"uint8": torch.uint8, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Output:
    """One output format of FastLoader in a run: ``dtype`` (a key of :data:`DTYPES`; float
    output is normalized with :data:`IMAGENET_NORMALIZE`) and ``channels_last``."""

    dtype: str = "uint8"
    channels_last: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}. Found: {shorten(self.dtype)}.")

    @property
    def name(self) -> str:
        """The loader's name in the results: ``FastLoader`` for uint8 NCHW (the default), else
        e.g. ``FastLoader channels_last float16``."""
        if self == Output():
            return FAST_NAME
        return f"{FAST_NAME} {'channels_last' if self.channels_last else 'NCHW'} {self.dtype}"

    def loader_kwargs(self) -> dict[str, Any]:
        """FastLoader's ``dtype``, ``channels_last`` and ``normalize`` for this format."""
        dtype = DTYPES[self.dtype]
        return dict(dtype=dtype, channels_last=self.channels_last,
                    normalize=None if dtype == torch.uint8 else IMAGENET_NORMALIZE)


LAYOUT_REFERENCE = Output("float32", False)  # every other format's images/s is compared with this one's

RoundCallback = Callable[[str], None]


def make_transform(kind: str, *, size: int = 224, resize: int = 256, seed: int | None = None) -> ImageTransform:
    """gpufeed's transform for ``kind``: "eval" = Resize(resize) + CenterCrop(size),
    "train" = RandomResizedCrop(size) + horizontal flip. Sizes in pixels."""
    if kind == "eval":
        return ResizeCenterCrop(size, resize)
    if kind == "train":
        return RandomResizedCrop(size, seed=seed)
    raise ValueError(f"`transform` must be one of {TRANSFORMS}. Found: {shorten(kind)}.")


def describe_geometry(kind: str, *, size: int = 224, resize: int = 256) -> str:
    """The transform in torchvision's words, e.g. ``"Resize(256)+CenterCrop(224)"``."""
    if kind == "eval":
        return f"Resize({resize})+CenterCrop({size})"
    return f"RandomResizedCrop({size})+RandomHorizontalFlip, shuffled"


def pil_available() -> bool:
    """True when Pillow imports (it is an optional dependency: ``gpufeed[bench]``)."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def single_threaded_cv2() -> contextlib.AbstractContextManager[None]:
    """OpenCV's thread pool at one thread inside the block (restored after); no-op without cv2."""
    return _single_threaded_cv2(import_if_missing=True)


def _ignore_sigint(worker_id: int) -> None:
    """Reference DataLoader workers leave Ctrl-C to the benchmark's process, as gpufeed's workers
    do: a terminal's SIGINT reaches the whole process group, and a worker interrupted inside a
    callback prints a traceback no one asked for (the bench stops them itself; it starts them
    with SIGINT held, so the window before this runs is closed too). A worker's fd-sharing
    thread (torch sends each batch's storage through ``multiprocessing.resource_sharer``) also
    prints one when the interrupted benchmark drops the connection it was sending on: such
    connection errors are not reported (``_quiet_connection_errors``)."""
    ignore_sigint()
    sys.excepthook = _quiet_connection_errors(sys.excepthook)


def _quiet_connection_errors(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` for every exception but a ConnectionError (a broken pipe, a reset connection)."""
    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not issubclass(kind, ConnectionError):
            hook(kind, value, tb)
    return excepthook


def loader_factories(
    root: str | os.PathLike,
    transform: str = "eval",
    *,
    batch_size: int = 64,
    num_workers: int = 2,
    seed: int = 0,
    size: int = 224,
    resize: int = 256,
    include: Iterable[str] = (PIL_NAME, CV_NAME, FAST_NAME),
    persistent_workers: bool = False,
    outputs: Iterable[Output] = (Output(),),
    on_error: str = "raise",
) -> dict[str, LoaderFactory]:
    """name -> a callable building a fresh loader of that pipeline (datasets are built once).

    ``include`` picks and orders the loaders (names :data:`PIL_NAME`, :data:`CV_NAME`,
    :data:`FAST_NAME`); :data:`FAST_NAME` stands for one FastLoader per ``outputs`` entry, named
    by :attr:`Output.name`. Every loader gets the same batch_size, num_workers, shuffle (train only),
    a fresh ``torch.Generator`` seeded with ``seed``, and ``persistent_workers``; FastLoaders
    get ``on_error`` (the DataLoader pipelines have no such option: they raise).
    """
    names = list(include)
    unknown = [n for n in names if n not in (PIL_NAME, CV_NAME, FAST_NAME)]
    if unknown or not names:
        raise ValueError(f"`include` must name some of {[PIL_NAME, CV_NAME, FAST_NAME]}. Found: {names}.")
    geometry = make_transform(transform, size=size, resize=resize)
    shuffle = transform == "train"
    persistent = persistent_workers and num_workers > 0

    def common() -> dict[str, Any]:
        return dict(batch_size=batch_size, num_workers=num_workers, shuffle=shuffle,
                    generator=torch.Generator().manual_seed(seed), persistent_workers=persistent)

    def fast(ds: ImageFolder, output: Output) -> LoaderFactory:
        return lambda: FastLoader(ds, **common(), seed=seed, on_error=on_error,
                                  **output.loader_kwargs())

    def reference(ds: _ReferenceFolder) -> LoaderFactory:
        return lambda: DataLoader(ds, **common(), worker_init_fn=_ignore_sigint)

    factories: dict[str, LoaderFactory] = {}
    for name in names:
        if name == FAST_NAME:
            ds = ImageFolder(root, transform=geometry)
            for output in dict.fromkeys(outputs):
                factories[output.name] = fast(ds, output)
        else:
            cls = PILImageFolder if name == PIL_NAME else OpenCVImageFolder
            factories[name] = reference(cls(root, geometry, seed=seed))
    return factories


@dataclass(frozen=True)
class Flatness:
    """PSS of the process tree (bytes) after each epoch of one loader with persistent workers."""

    loader: str
    pss_bytes: tuple[int, ...]
    batches_per_epoch: int
    peak_pss_bytes: int

    @property
    def growth_bytes(self) -> int:
        """PSS after the last epoch minus PSS after the first (bytes; > 0: grew)."""
        return self.pss_bytes[-1] - self.pss_bytes[0]

    @property
    def growth_fraction(self) -> float:
        """:attr:`growth_bytes` relative to the PSS after the first epoch."""
        return self.growth_bytes / self.pss_bytes[0] if self.pss_bytes[0] else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"loader": self.loader, "pss_bytes": list(self.pss_bytes),
                "batches_per_epoch": self.batches_per_epoch, "peak_pss_bytes": self.peak_pss_bytes,
                "growth_bytes": self.growth_bytes, "growth_fraction": self.growth_fraction}


def measure_flatness(
    name: str,
    factory: LoaderFactory,
    *,
    num_epochs: int = 3,
    num_batches: int | None = None,
    on_epoch: RoundCallback | None = None,
) -> Flatness:
    """Iterates one loader (built once: give it persistent workers) for ``num_epochs`` epochs of at
    most ``num_batches`` batches, reading every page of every batch; PSS after each epoch."""
    if num_epochs < 1:
        raise ValueError(f"`num_epochs` must be >= 1. Found: {num_epochs}.")
    readings: list[int] = []
    batches = 0
    with PeakPSS() as mem:
        loader = factory()
        try:
            for _ in range(num_epochs):
                batches = 0
                for batch in loader:
                    touch_pages(batch)
                    del batch
                    batches += 1
                    if num_batches is not None and batches >= num_batches:
                        break
                gc.collect()
                readings.append(tree_memory().pss_bytes)
                if on_epoch is not None:
                    on_epoch(name)
        finally:
            close = getattr(loader, "close", None)
            if callable(close):
                close()
            del loader
            gc.collect()
    return Flatness(name, tuple(readings), batches, mem.peak_bytes)


@dataclass(frozen=True)
class ImageBenchResult:
    """One end-to-end run: the comparison and FastLoader's memory across epochs."""

    root: str
    transform: str
    num_images: int
    batch_size: int
    num_workers: int
    result: CompareResult
    flatness: Flatness | None
    geometry: str = ""  # e.g. "Resize(256)+CenterCrop(224)"
    start_pss_bytes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per counted round

    def added_pss_bytes(self, name: str) -> float:
        """Median over rounds of (the round's peak PSS - the tree's PSS when it began), bytes:
        the memory the loader added, free of drift in the main process between rounds."""
        rounds = self.result.summary(name).rounds
        starts = self.start_pss_bytes.get(name, ())
        if len(starts) != len(rounds):
            return float("nan")
        return statistics.median(r.peak_pss_bytes - b for r, b in zip(rounds, starts))

    @property
    def baseline(self) -> str:
        return self.result.baseline

    def added_pss_ratio(self, name: str, baseline: str | None = None) -> float:
        """:meth:`added_pss_bytes` of ``name`` over the baseline's (< 1: ``name`` adds less)."""
        base = self.added_pss_bytes(baseline or self.baseline)
        return self.added_pss_bytes(name) / base if base > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: settings, every round, ratios, flatness, environment."""
        out = {"benchmark": "images", "root": self.root, "transform": self.transform,
               "geometry": self.geometry,
               "num_images": self.num_images, "batch_size": self.batch_size,
               "num_workers": self.num_workers, **self.result.to_dict()}
        names = [s.name for s in self.result.loaders]
        for n in names:
            out["ratios"][n].update({f"images_per_s_vs_{r}": self.result.ratio(n, r) for r in names})
            out["ratios"][n]["added_pss"] = self.added_pss_ratio(n)
        out["added_pss_bytes"] = {n: self.added_pss_bytes(n) for n in names}
        out["start_pss_bytes"] = {n: list(v) for n, v in self.start_pss_bytes.items()}
        out["flatness"] = None if self.flatness is None else self.flatness.to_dict()
        return out


def image_environment(num_workers: int) -> dict[str, Any]:
    """:func:`describe_environment` plus ``pillow`` and ``decoders``: one line naming what decodes
    JPEGs in each pipeline (FastLoader's backend, Pillow's libjpeg, OpenCV)."""
    import cv2

    env = describe_environment(num_workers=num_workers)
    env["pillow"] = package_version("PIL", "pillow")
    found = backends()
    turbo = found.get("turbojpeg", {})
    jpeg = found.get("jpeg", "n/a")
    if jpeg == "turbojpeg":
        jpeg += (f" (PyTurboJPEG {turbo.get('pyturbojpeg_version')}, "
                 f"{os.path.basename(str(turbo.get('library')))})")
    parts = [f"{FAST_NAME}: jpeg={jpeg}, other={found.get('other', 'n/a')}"]
    if pil_available():
        from PIL import features

        lib = (f"libjpeg-turbo {features.version('libjpeg_turbo')}"
               if features.check_feature("libjpeg_turbo") else f"libjpeg {features.version('jpg')}")
        parts.append(f"{PIL_NAME}: Pillow {env['pillow']} with {lib}")
    parts.append(f"{CV_NAME}: OpenCV {cv2.__version__} imdecode")
    env["decoders"] = "; ".join(parts)
    return env


def _instrumented(factory: LoaderFactory, name: str, baselines: list[int],
                  callback: RoundCallback | None) -> LoaderFactory:
    """``factory`` that first appends this process tree's PSS (bytes) to ``baselines`` (the
    round's starting point: compare() calls the factory right after its sampler started) and,
    with a ``callback``, calls ``callback(name)`` once the loader's iteration ends or is dropped."""

    class _Reported:
        def __init__(self, loader: Iterable[Any], report: RoundCallback) -> None:
            self.loader = loader
            self.report = report

        def __iter__(self) -> Iterator[Any]:
            it = iter(self.loader)
            try:
                yield from it
            except (Exception, KeyboardInterrupt):
                stop_workers(it)  # Ctrl-C or an error: do not leave them to the traceback
                raise
            finally:
                self.report(name)

    def build() -> Iterable[Any]:
        baselines.append(tree_memory().pss_bytes)
        loader = factory()
        return loader if callback is None else _Reported(loader, callback)

    return build


def run_image_bench(
    root: str | os.PathLike,
    transform: str = "eval",
    *,
    num_workers: int = 2,
    batch_size: int = 64,
    num_batches: int | None = None,
    num_rounds: int = 3,
    num_warmup_rounds: int = 1,
    num_epochs: int = 3,
    seed: int = 0,
    size: int = 224,
    resize: int = 256,
    include_pil: bool | None = None,
    on_round: RoundCallback | None = None,
    outputs: Iterable[Output] = (Output(),),
    include_reference: bool = True,
    on_error: str = "raise",
) -> ImageBenchResult:
    """Compares the three pipelines on ``root`` in alternating rounds, then FastLoader's memory
    over ``num_epochs`` epochs (0: skip) with persistent workers.

    ``num_batches``: batches per round (default: the full batches of one epoch, at most 50; the
    last, partial batch is left out so every counted batch has ``batch_size`` images).
    ``include_pil``: None = when Pillow imports (otherwise the OpenCV pipeline is the baseline).
    ``on_round(name)`` is called after each round and each flatness epoch (progress bars).
    ``outputs``: FastLoader's output formats, one loader each (the flatness check runs the
    first); ``include_reference=False`` leaves the DataLoader pipelines out (layout runs).
    ``on_error``: FastLoader's (see :func:`loader_factories`).
    """
    if transform not in TRANSFORMS:
        raise ValueError(f"`transform` must be one of {TRANSFORMS}. Found: {shorten(transform)}.")
    if batch_size < 1 or num_workers < 0:
        raise ValueError(f"`batch_size` must be >= 1 and `num_workers` >= 0. "
                         f"Found: {batch_size}, {num_workers}.")
    outputs = tuple(dict.fromkeys(outputs))
    if not outputs:
        raise ValueError("`outputs` must hold at least one Output.")
    with_pil = include_reference and (pil_available() if include_pil is None else include_pil)
    include = ([PIL_NAME] if with_pil else []) + ([CV_NAME] if include_reference else []) + [FAST_NAME]
    factories = loader_factories(root, transform, batch_size=batch_size, num_workers=num_workers,
                                 seed=seed, size=size, resize=resize, include=include,
                                 outputs=outputs, on_error=on_error)
    names = list(factories)
    num_images = len(ImageFolder(root))
    full_batches = num_images // batch_size
    if num_batches is None:
        num_batches = min(full_batches, 50)
    if num_batches < 2 or num_batches > full_batches:
        raise ValueError(f"need 2 to {full_batches} full batches per round ({num_images} images, "
                         f"batch_size {batch_size}). Found: {num_batches}. Fix: pass --batches in "
                         f"that range, lower --batch-size, or use a folder with more images.")
    baselines: dict[str, list[int]] = {n: [] for n in names}
    factories = {n: _instrumented(f, n, baselines[n], on_round) for n, f in factories.items()}
    env = image_environment(num_workers)
    with single_threaded_cv2():
        result = compare(factories, num_batches=num_batches, num_rounds=num_rounds,
                         num_warmup_rounds=num_warmup_rounds, environment=env,
                         baseline=names[0] if include_reference or LAYOUT_REFERENCE not in outputs
                         else LAYOUT_REFERENCE.name)
        flatness = None
        if num_epochs > 0:
            persistent = loader_factories(root, transform, batch_size=batch_size, num_workers=num_workers,
                                          seed=seed, size=size, resize=resize, include=[FAST_NAME],
                                          persistent_workers=True, outputs=outputs[:1],
                                          on_error=on_error)[outputs[0].name]
            flatness = measure_flatness(outputs[0].name, persistent, num_epochs=num_epochs,
                                        num_batches=None if full_batches <= 2 * num_batches else num_batches,
                                        on_epoch=on_round)
    counted = {n: tuple(b[-num_rounds:]) for n, b in baselines.items()}
    return ImageBenchResult(str(root), transform, num_images, batch_size, num_workers, result, flatness,
                            describe_geometry(transform, size=size, resize=resize), counted)
