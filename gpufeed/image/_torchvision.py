"""torchvision and timm transform pipelines, translated to gpufeed's image fast path (the code; documented
in ``gpufeed.image``, which re-exports it)."""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from gpufeed.errors import GpufeedWarning, is_int, shorten
from gpufeed.image._normalize import affine, check_image_output, convert_, work_dtype
from gpufeed.image._recipe_ops import place
from gpufeed.image._tensor_ops import op_text
from gpufeed.image._transforms import (
    CropParams,
    ImageTransform,
    RandomResizedCrop,
    Resize,
    ResizeCenterCrop,
)
from gpufeed.image.augment._base import FloatRowOp, RowOp, RowOps
from gpufeed.image.augment._ops import RandomHorizontalFlip

__all__ = ["TorchvisionPipeline", "from_torchvision", "is_torchvision"]

log = logging.getLogger("gpufeed.image")  # the public module's name

_PREFIXES = ("torchvision.transforms", "timm.data")
_BILINEAR = ("bilinear", 2)  # InterpolationMode.BILINEAR's value; PIL.Image.BILINEAR
_BICUBIC = ("bicubic", 3)
#: interpolation name -> gpufeed's ``interpolation`` (bilinear is "auto": antialiased shrinks)
_INTERPOLATIONS = {"bilinear": "auto", "bicubic": "bicubic", "random": "random"}
_GEOMETRY = ("Resize", "CenterCrop", "RandomResizedCrop", "RandomHorizontalFlip",
             "RandomResizedCropAndInterpolation")
_GEOMETRY_OPS = tuple(f"{name}(" for name in _GEOMETRY if name != "RandomHorizontalFlip")
_TO_TENSOR = {"ToTensor": "float", "PILToTensor": "uint8", "ToImage": "image",
              "MaybeToTensor": "float", "MaybePILToTensor": "uint8"}  # the last two: timm's


#: The classes of torchvision's references/classification/presets.py, which people copy into
#: their projects (it is not a package): each holds its pipeline, a torchvision ``Compose`` (v1 or
#: v2), in ``.transforms`` and calls it in ``__call__``.
_PRESETS = frozenset({"ClassificationPresetTrain", "ClassificationPresetEval"})


def _preset_pipeline(obj: object) -> Any:
    """The pipeline held by ``obj`` when ``obj`` is one of torchvision's reference presets
    (``_PRESETS``, recognised by shape: the class name, callable, a torchvision pipeline in
    ``.transforms``), else None."""
    if type(obj).__name__ not in _PRESETS or not callable(obj):
        return None
    inner = getattr(obj, "transforms", None)
    return inner if type(inner).__module__.startswith(_PREFIXES) else None


def is_torchvision(obj: object) -> bool:
    """True when ``obj`` is a torchvision transform (its class lives in ``torchvision.transforms``),
    a timm one (``timm.data``: timm's pipelines are torchvision ``Compose`` of both), or one of
    torchvision's reference presets holding such a pipeline (``ClassificationPresetTrain`` /
    ``ClassificationPresetEval``)."""
    return type(obj).__module__.startswith(_PREFIXES) or _preset_pipeline(obj) is not None


def _rgb_no_op(op: object) -> bool:
    """True for a conversion to RGB of a PIL image, a no-op on gpufeed's RGB decode: open_clip's
    ``_convert_to_rgb`` function (``image.convert("RGB")``, copied into many CLIP pipelines) and
    its ``MaybeConvertMode(mode="RGB")``, recognised by name."""
    if inspect.isfunction(op):
        return op.__name__ == "_convert_to_rgb"
    return type(op).__name__ == "MaybeConvertMode" and getattr(op, "mode", None) == "RGB"


def _to_tensor_name(op: object) -> str | None:
    """The ``_TO_TENSOR`` name of ``op`` when it is one of those ops, or a subclass of one
    that keeps its name (open_clip's ``MaybeToTensor`` subclasses torchvision's ``ToTensor``)."""
    name = type(op).__name__
    if name not in _TO_TENSOR:
        return None
    return name if any(c.__module__.startswith(_PREFIXES) for c in type(op).__mro__) else None


#: explain_one()'s label of each place an op runs (``OpRoute.where``)
WHERE = {"fast": "fast", "tensor": "tensor", "float": "float", "pil": "NO"}


@dataclass(frozen=True)
class OpRoute:
    """Where one op of a pipeline runs: ``fast`` (gpufeed's own path: its ops in the worker,
    dtype and normalize in the batch stage) or not, and how or why. ``where`` says more:
    "fast", "tensor" (run as given on the row as a tensor), "float" (run as given on the
    normalized float row) or "pil" (needs the pipeline as given on PIL images)."""

    op: str
    fast: bool
    note: str
    where: str = ""

    @property
    def place(self) -> str:
        """``where``, or "fast"/"pil" from ``fast`` when not given."""
        return self.where or ("fast" if self.fast else "pil")


class TorchvisionPipeline(ImageTransform):
    """A torchvision pipeline translated to gpufeed's fast path (made by :func:`from_torchvision`).

    ``geometry`` is the gpufeed transform with the pipeline's crop/resize/flip; ``output`` the
    tensor op ("float": ``ToTensor``, "uint8": ``PILToTensor``, "image": ``ToImage``), ``dtype``
    the resulting dtype, ``normalize`` the ``Normalize`` (mean, std) or None; ``routes`` is what
    :func:`gpufeed.image.explain_transform` reports. Images are used as stored (EXIF orientation
    ignored, as torchvision's PIL loader does). Used as a dataset's transform, ``dataset[i]``
    returns what the torchvision pipeline returns (e.g. a normalized float32 CHW tensor); a
    ``FastLoader`` batches the same values, applying dtype and ``normalize`` to the whole batch.
    """

    apply_exif = False

    def __init__(self, geometry: ResizeCenterCrop | RandomResizedCrop | Resize, *, output: str,
                 dtype: torch.dtype, normalize: tuple[tuple[float, ...], tuple[float, ...]] | None,
                 routes: tuple[OpRoute, ...], source: str) -> None:
        if not isinstance(geometry, (ResizeCenterCrop, RandomResizedCrop, Resize)):
            raise TypeError(f"`geometry` must be a gpufeed ResizeCenterCrop, RandomResizedCrop "
                            f"or Resize. "
                            f"Found: {type(geometry).__name__} {shorten(geometry)}.")
        if output not in ("float", "uint8", "image"):
            raise ValueError(f"`output` must be 'float', 'uint8' or 'image'. Found: {shorten(output)}.")
        check_image_output(dtype, normalize)
        if normalize is not None and dtype == torch.uint8:
            raise ValueError(f"`normalize` needs a float `dtype` (Normalize follows ToTensor or "
                             f"ToDtype(float, scale=True)). Found: dtype {dtype}.")
        self.geometry = geometry
        self.ops = geometry.ops
        self.float_ops = geometry.float_ops
        self.size = geometry.output_size
        self.interpolation = geometry.interpolation
        self.dct_scaling = geometry.dct_scaling
        self.backend = geometry.backend
        self.deterministic = geometry.deterministic
        self.seed = geometry.seed
        self.output = output
        self.dtype = dtype
        self.normalize = normalize
        self.routes = routes
        self.source = source

    def _box(self, height: int, width: int, seed: int, epoch: int,
             index: int) -> tuple[float, float, float, float, bool]:
        return self.geometry._box(height, width, seed, epoch, index)

    def with_view(self, view: int) -> TorchvisionPipeline:
        """A copy serving view ``view`` of a ``MultiView`` (its geometry's keys too)."""
        twin = cast("TorchvisionPipeline", super().with_view(view))
        twin.geometry = self.geometry.with_view(view)  # type: ignore[assignment]
        return twin

    def params(self, seed: int, epoch: int, index: int, height: int, width: int) -> CropParams:
        """The crop box (source pixels, image as stored) and flip of sample ``index`` in
        ``epoch``: torchvision's ``F.resized_crop(img, top, left, height, width, size)`` then
        ``F.hflip`` when ``flip`` give this pipeline's output. RandomResizedCrop pipelines only
        (a Resize + CenterCrop pipeline has no random parameters: ValueError)."""
        if not isinstance(self.geometry, RandomResizedCrop):
            raise ValueError("params() needs a RandomResizedCrop pipeline; Resize + CenterCrop "
                             "is deterministic: torchvision's own pipeline gives the same box.")
        return self.geometry.params(seed, epoch, index, height, width)

    def to_output(self, image: torch.Tensor, *, index: int = 0, epoch: int = 0,
                  seed: int = 0) -> Any:
        """The pipeline's result for ``image``, this transform's uint8 CHW output for sample
        ``index``: dtype and ``normalize`` as the loader's batch stage applies them (same
        numbers), then the float ops (``RandomErasing``) drawn from (seed, epoch, index) as the
        workers draw them; a ``tv_tensors.Image`` for ``ToImage`` pipelines."""
        out: torch.Tensor = image
        if self.dtype != torch.uint8:
            constants = None if self.normalize is None else affine(self.normalize, work_dtype(self.dtype))
            batch = image[None].contiguous()
            out = convert_(torch.empty(batch.shape, dtype=self.dtype), batch, constants)[0]
            if self.float_ops:
                out = torch.as_tensor(RowOps(float_ops=self.float_ops).apply_float(
                    out, seed, epoch, index, self.view))
        if self.output == "image":
            out = importlib.import_module("torchvision.tv_tensors").Image(out)
        return out

    def batch_options(self, normalize: Any,
                      dtype: torch.dtype | None) -> tuple[Any, torch.dtype | None]:
        """The loader's (normalize, dtype) with this pipeline's: ``Normalize`` in the pipeline
        and ``normalize=`` on the loader is a ValueError; the loader's float ``dtype`` (e.g.
        float16) replaces the pipeline's."""
        if normalize is not None and self.normalize is not None:
            raise ValueError(
                f"the transform's torchvision pipeline has Normalize(mean={list(self.normalize[0])}, "
                f"std={list(self.normalize[1])}) and the loader has normalize={shorten(normalize)}: "
                "images would be normalized twice. Drop one (gpufeed applies the pipeline's "
                "Normalize to whole batches already).")
        if dtype is None:  # a uint8 pipeline leaves the loader's default (float32 with normalize)
            return ((self.normalize if normalize is None else normalize),
                    None if self.dtype == torch.uint8 else self.dtype)
        if dtype == torch.uint8 and (self.dtype != torch.uint8 or self.normalize is not None):
            raise ValueError(f"dtype=torch.uint8 on the loader contradicts the transform's "
                             f"torchvision pipeline, which outputs {self.dtype}"
                             f"{' normalized' if self.normalize else ''}. Drop `dtype`, or "
                             f"drop the pipeline's dtype/Normalize ops.")
        return (self.normalize if normalize is None else normalize), dtype

    def __repr__(self) -> str:
        return f"TorchvisionPipeline({self.source}) -> {self.geometry!r}"


@dataclass
class _Walk:
    """What the ops of a pipeline said so far (one pass in order)."""

    routes: list[OpRoute] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    resize: int | None = None
    resize_hw: tuple[int, int] | None = None  # Resize((h, w))
    interpolation: str = "auto"
    crop: tuple[int, int] | None = None
    rrc: Any = None
    flip: bool = False
    output: str | None = None
    dtype: torch.dtype | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    rejected: int = 0  # ops not translated (the rest of ``blockers`` is about the whole pipeline)
    ops: list[RowOp] = field(default_factory=list)  # on the uint8 rows, after the geometry
    float_ops: list[FloatRowOp] = field(default_factory=list)  # on the normalized rows

    def ok(self, op: str, note: str, where: str = "fast") -> None:
        self.routes.append(OpRoute(op, True, note, where))

    def no(self, op: str, why: str) -> None:
        self.routes.append(OpRoute(op, False, why, "pil"))
        self.blockers.append(f"{op}: {why}")
        self.rejected += 1

    @property
    def domain(self) -> str:
        """What an op sees here in the original pipeline: "pil", "uint8", "float" or
        "normalized" (``gpufeed.image._recipe_ops``)."""
        if self.output is None:
            return "pil"
        if self.normalize is not None:
            return "normalized"
        return "float" if self.dtype is not None and self.dtype.is_floating_point else "uint8"

    @property
    def cropped(self) -> bool:
        """True once the crop/resize is known (later ops run on the cropped rows)."""
        return self.rrc is not None or self.crop is not None or self.resize_hw is not None

    def augment(self, op: Any, text: str) -> None:
        """Place an op the walk does not handle itself (``recipe_ops.place``)."""
        after = self.cropped or any(r.op.startswith(_GEOMETRY_OPS) and not r.fast
                                    for r in self.routes)  # a rejected crop says it already
        placed = place(op, domain=self.domain, after_geometry=after, text=text)
        if placed.where == "pil":
            self.no(text, placed.note)
            return
        if placed.row_op is not None:
            self.ops.append(placed.row_op)
        if placed.float_op is not None:
            self.float_ops.append(placed.float_op)
        self.ok(text, placed.note, placed.where)


def _flatten(transform: Any) -> list[Any]:
    preset = _preset_pipeline(transform)
    if preset is not None:
        return _flatten(preset)
    if type(transform).__name__ == "Compose" and hasattr(transform, "transforms"):
        return [op for inner in transform.transforms for op in _flatten(inner)]
    return [transform]


def _interp_name(value: Any) -> str:
    """torchvision's / PIL's / timm's interpolation as a name: "bilinear", "bicubic", "random"
    (timm's pair of bilinear and bicubic, picked per sample), or what was found."""
    if isinstance(value, (tuple, list)):
        names = {_interp_name(v) for v in value}
        return "random" if names == {"bilinear", "bicubic"} else str(value)
    raw = getattr(value, "value", value)
    if raw in _BILINEAR:
        return "bilinear"
    return "bicubic" if raw in _BICUBIC else str(raw)


def _int_size(value: Any) -> int | None:
    """An int, or a one-element sequence of one (torchvision's Resize([s])), else None."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 1:
        value = value[0]
    return value if is_int(value) else None


def _pair(value: Any) -> tuple[int, int] | None:
    if is_int(value):
        return (value, value)
    if isinstance(value, Sequence) and len(value) in (1, 2) and all(
            is_int(v) for v in value):
        return (int(value[0]), int(value[-1]))
    return None


def _resampling(walk: _Walk, op: Any, name: str) -> bool:
    """Check interpolation and antialias of a resizing op and keep the interpolation
    (``walk.interpolation``); record the blocker if any."""
    interp = _interp_name(getattr(op, "interpolation", "bilinear"))
    if interp not in _INTERPOLATIONS:
        walk.no(name, f"interpolation {interp}: gpufeed resizes bilinear, bicubic or timm's "
                      f"random bilinear/bicubic (antialiased) only")
        return False
    if walk.output is not None and getattr(op, "antialias", True) is False:
        walk.no(name, "antialias=False on a tensor aliases on downscaling; gpufeed always "
                      "antialiases (as PIL does)")
        return False
    walk.interpolation = _INTERPOLATIONS[interp]
    return True


def _float_dtype(op: Any) -> tuple[torch.dtype | None, str]:
    """(dtype, "") for a dtype op gpufeed can apply, else (None, why)."""
    dtype = op.dtype
    if isinstance(dtype, dict):
        picked = [v for k, v in dtype.items() if getattr(k, "__name__", k) in ("Image", "Tensor")]
        if len(picked) != 1 or not isinstance(picked[0], torch.dtype):
            return None, f"a dtype dict gpufeed cannot read: {shorten(dtype)}"
        dtype = picked[0]
    if not isinstance(dtype, torch.dtype):
        return None, f"dtype {shorten(dtype)} is not a torch.dtype"
    if dtype == torch.uint8:
        return dtype, ""
    if not dtype.is_floating_point:
        return None, f"dtype {dtype}: gpufeed outputs uint8 or floats"
    if type(op).__name__ == "ToDtype" and not getattr(op, "scale", False):
        return None, "scale=False keeps 0-255 values; gpufeed's float output is on the 0-1 scale"
    return dtype, ""


def _walk_op(walk: _Walk, op: Any) -> None:
    name, text = type(op).__name__, op_text(op)
    to_tensor = _to_tensor_name(op)
    if _rgb_no_op(op) and walk.output is None:
        walk.ok(text, "no-op: gpufeed decodes every image to RGB")
    elif to_tensor is not None:
        if walk.output is not None:
            walk.no(text, "a second conversion to tensor")
        else:
            walk.output = _TO_TENSOR[to_tensor]
            to_float = walk.output == "float"
            walk.dtype = torch.float32 if to_float else torch.uint8
            walk.ok(text, ("float32 on the 0-1 scale, in the batch stage" if to_float
                           else "uint8 CHW rows written by the workers"))
    elif not is_torchvision(op):
        walk.augment(op, text)  # a user's op: a tensor op where the pipeline gives it tensors
    elif name in _GEOMETRY:
        _walk_geometry(walk, op, name, text)
    elif name == "ToPureTensor" and walk.output is not None:
        walk.output = "float" if walk.dtype is not None and walk.dtype.is_floating_point else "uint8"
        walk.ok(text, "no-op: batches are plain tensors")
    elif name in ("ToDtype", "ConvertImageDtype"):
        dtype, why = _float_dtype(op)
        if walk.output is None:
            walk.no(text, "comes before ToTensor/PILToTensor/ToImage (applies to a PIL image)")
        elif dtype is None:
            walk.no(text, why)
        elif walk.normalize is not None:
            walk.no(text, "a dtype conversion after Normalize")
        else:
            if walk.dtype is not None and walk.dtype.is_floating_point and dtype == torch.uint8:
                walk.no(text, "converts floats back to uint8")
                return
            walk.dtype = dtype
            walk.ok(text, f"{dtype} in the batch stage" if dtype != torch.uint8 else "no-op")
    elif name == "Normalize":
        _walk_normalize(walk, op, text)
    else:
        walk.augment(op, text)


def _walk_geometry(walk: _Walk, op: Any, name: str, text: str) -> None:
    if name == "RandomHorizontalFlip":
        if float(op.p) == 0.5 and not walk.flip and not walk.ops and (
                walk.rrc is not None or not walk.cropped):  # before or after the crop: the same
            walk.flip = True
            walk.ok(text, "flip drawn from (seed, epoch, index), applied in the worker")
        else:  # another p, another place, or a second flip: an op on the rows
            walk.augment(op, text)
        return
    if walk.resize is not None or walk.cropped:
        if not (name == "CenterCrop" and walk.resize is not None and walk.crop is None):
            walk.no(text, "a second crop/resize: gpufeed does one crop + resize per image")
            return
    if name == "Resize":
        size = _int_size(op.size)
        if size is None and _pair(op.size) is not None:
            if _resampling(walk, op, text):
                walk.resize_hw = _pair(op.size)
                walk.ok(text, "the whole image resized to (h, w) in the worker")
        elif size is None:
            walk.no(text, f"size={shorten(op.size)} is not an int or (h, w)")
        elif getattr(op, "max_size", None) is not None:
            walk.no(text, f"max_size={op.max_size} is not translated")
        elif _resampling(walk, op, text):
            walk.resize = size
            walk.ok(text, "one crop + resize in the worker (with CenterCrop)")
    elif name == "CenterCrop":
        crop = _pair(op.size)
        if walk.resize is None:
            walk.no(text, "CenterCrop without a translated Resize(int) before it")
        elif crop is None or max(crop) > walk.resize:
            walk.no(text, f"size={shorten(op.size)} does not fit Resize({walk.resize}) "
                          "(torchvision pads with zeros)")
        else:
            walk.crop = crop
            walk.ok(text, "one crop + resize in the worker (with Resize)")
    elif _resampling(walk, op, text):  # RandomResizedCrop
        walk.rrc = op
        walk.ok(text, "crop box drawn from (seed, epoch, index); crop + resize in the worker")


def _walk_normalize(walk: _Walk, op: Any, text: str) -> None:
    try:
        mean = tuple(float(v) for v in op.mean)
        std = tuple(float(v) for v in op.std)
    except (TypeError, ValueError):
        walk.no(text, "mean/std are not sequences of numbers")
        return
    if len(mean) == 1:
        mean = mean * 3
    if len(std) == 1:
        std = std * 3
    if walk.output is None or walk.dtype is None or not walk.dtype.is_floating_point:
        walk.no(text, "comes before the conversion to a float tensor")
    elif walk.normalize is not None:
        walk.no(text, "a second Normalize")
    elif len(mean) != 3 or len(std) != 3 or 0.0 in std:
        walk.no(text, "needs 3 means and 3 non-zero stds (RGB)")
    else:
        walk.normalize = (mean, std)
        walk.ok(text, "(x - mean) / std on the whole batch (on the GPU with device=)")


def _translate(transform: Any) -> tuple[TorchvisionPipeline | None, _Walk]:
    walk = _Walk()
    for op in _flatten(transform):
        _walk_op(walk, op)
    if walk.output is None:
        walk.blockers.append("no ToTensor/PILToTensor/ToImage: the pipeline returns PIL images, "
                             "which a batch cannot hold")
    if walk.rejected == 0 and walk.rrc is None and walk.resize_hw is None and (
            walk.resize is None or walk.crop is None):
        walk.blockers.append("no fixed output size: needs RandomResizedCrop, or Resize(int) "
                             "followed by CenterCrop")
    if walk.flip and walk.rrc is None:  # no RandomResizedCrop to carry it: a flip of the row
        walk.ops.insert(0, RandomHorizontalFlip(0.5))
    geometry: ResizeCenterCrop | RandomResizedCrop | Resize | None = None
    try:
        if walk.rrc is not None:
            geometry = RandomResizedCrop(size=_pair(walk.rrc.size) or 0,
                                         scale=tuple(walk.rrc.scale), ratio=tuple(walk.rrc.ratio),
                                         flip=walk.flip, interpolation=walk.interpolation,
                                         ops=tuple(walk.ops), float_ops=tuple(walk.float_ops))
        elif walk.resize_hw is not None:
            geometry = Resize(size=walk.resize_hw, interpolation=walk.interpolation,
                              ops=tuple(walk.ops), float_ops=tuple(walk.float_ops))
        elif walk.crop is not None and walk.resize is not None:
            geometry = ResizeCenterCrop(size=walk.crop, resize=walk.resize,
                                        interpolation=walk.interpolation, ops=tuple(walk.ops),
                                        float_ops=tuple(walk.float_ops))
    except (TypeError, ValueError) as exc:  # parameters torchvision took and gpufeed does not
        walk.blockers.append(f"gpufeed cannot take these parameters: {exc}")
    if walk.blockers or geometry is None or walk.output is None or walk.dtype is None:
        return None, walk
    pipeline = TorchvisionPipeline(geometry, output=walk.output, dtype=walk.dtype,
                                   normalize=walk.normalize, routes=tuple(walk.routes),
                                   source=f"{type(transform).__name__} of {len(walk.routes)} ops")
    return pipeline, walk


def from_torchvision(transform: Any) -> TorchvisionPipeline:
    """Translate a torchvision transform pipeline to gpufeed's fast path (module docstring).

    Returns a :class:`TorchvisionPipeline`, to pass as a dataset's ``transform`` (datasets also
    translate a torchvision pipeline given directly). Raises TypeError for an object that is not
    from ``torchvision.transforms``, ValueError naming each op or parameter that prevents the
    translation (give the pipeline itself as ``transform=`` to run it as given).
    """
    if isinstance(transform, TorchvisionPipeline):
        return transform
    if not is_torchvision(transform):
        raise TypeError(f"from_torchvision() takes a torchvision transform "
                        f"(torchvision.transforms or .v2, timm's, or a ClassificationPresetTrain / "
                        f"ClassificationPresetEval of torchvision's references). "
                        f"Found: {type(transform).__name__} "
                        f"{shorten(transform)}.")
    pipeline, walk = _translate(transform)
    if pipeline is None:
        raise ValueError("cannot translate this torchvision pipeline to gpufeed's fast path: "
                         + "; ".join(walk.blockers) + ". Pass the pipeline itself as "
                         "`transform=` to run it as given (slower), or change those ops.")
    return pipeline


def translate_or_none(transform: Any) -> tuple[TorchvisionPipeline | None, str]:
    """(translation or None, :func:`gpufeed.image.explain_transform`'s report) for a torchvision object, as datasets
    use it: None means "run the pipeline as given"."""
    pipeline, walk = _translate(transform)
    return pipeline, _report(pipeline, walk)


def warn_fallback(transform: Any, where: str) -> None:
    """Warn (``GpufeedWarning``) that ``transform``, a torchvision/timm pipeline, runs as given
    on PIL images in ``where`` (e.g. "ImageFolder"): which ops, why, what to use instead.
    Python's warning filters show one such message once per process by default."""
    warnings.warn(GpufeedWarning(
        f"{where}: this pipeline leaves gpufeed's fast path and runs as given on PIL images in "
        f"the workers (the generic path, slower): {untranslated_reasons(transform)}. "
        f"gpufeed.explain(transform) lists where every op runs."), stacklevel=4)


def untranslated_reasons(transform: Any) -> str:
    """Why ``transform``, a torchvision/timm pipeline, is not translated: each op or fact that
    prevents it, joined with "; "."""
    _, walk = _translate(transform)
    return "; ".join(walk.blockers) or "it cannot be translated"


def _report(pipeline: TorchvisionPipeline | None, walk: _Walk) -> str:
    if pipeline is not None:
        kind = ("RandomResizedCrop" if isinstance(pipeline.geometry, RandomResizedCrop) else
                "Resize (h, w)" if isinstance(pipeline.geometry, Resize) else "Resize + CenterCrop")
        h, w = pipeline.output_size
        head = (f"torchvision pipeline -> gpufeed fast path ({kind} to {h}x{w}, {pipeline.dtype}"
                f"{', normalized' if pipeline.normalize else ''}; images as stored, EXIF "
                f"orientation ignored as torchvision does):")
    else:
        why = [f"{walk.rejected} op(s) cannot be translated (NO below)"] if walk.rejected else []
        why += walk.blockers[walk.rejected:]
        head = ("torchvision pipeline runs as given (workers call it on PIL images: generic "
                "path, slower) because " + "; ".join(why) + ":")
    lines = [head]
    for route in walk.routes:  # "ok": translatable, but the pipeline as a whole runs as given
        label = WHERE[route.place] if pipeline is not None or not route.fast else "ok"
        lines.append(f"  {label:<6}  {route.op}: {route.note}")
    return "\n".join(lines)


def _where_of(op: Any) -> str:
    """explain_one()'s label of one of a transform's ops."""
    return {"TensorOp": "tensor", "TensorFloatOp": "float"}.get(type(op).__name__, "fast")


#: What a user coming from ``ToTensor`` must know about a gpufeed transform's batches.
UINT8_HINT = ("FastLoader's batches are uint8 0-255 by default (as PILToTensor gives; a quarter "
              "of float32's bytes), not ToTensor's float 0-1: pass FastLoader(..., "
              "dtype=torch.float32) for x / 255, or normalize=(mean, std) for normalized float32.")


def explain_one(transform: Any) -> str:
    """One transform's report for :func:`gpufeed.image.explain_transform`: which of its ops run
    on gpufeed's fast path and which do not, and why (one line per op); for gpufeed's own
    transforms, other callables and None too."""
    if isinstance(transform, TorchvisionPipeline):
        walk = _Walk(routes=list(transform.routes))
        return _report(transform, walk)
    if isinstance(transform, ImageTransform):
        lines = [f"gpufeed transform {type(transform).__name__}: fast path (decode, crop, resize "
                 f"and flip into the batch in the workers; EXIF orientation applied). {UINT8_HINT}"]
        for op in transform.ops:
            lines.append(f"  {_where_of(op):<6}  {op_text(op)}: on the uint8 row in the worker")
        for fop in transform.float_ops:
            lines.append(f"  {_where_of(fop):<6}  {op_text(fop)}: on the normalized float row")
        return "\n".join(lines)
    if transform is None:
        return ("no transform: dataset[i] returns the full decoded image; a loader needs a "
                "transform of fixed output size to batch images.")
    if is_torchvision(transform):
        return translate_or_none(transform)[1]
    return (f"{op_text(transform)} is a callable gpufeed cannot look into: workers call it on "
            f"PIL images (generic path, slower). For the fast path use gpufeed.ResizeCenterCrop "
            f"/ RandomResizedCrop or a torchvision pipeline of the ops gpufeed translates.")

