"""torchvision v2 detection/segmentation pipelines (given as ``transforms=``, image and target
together) translated op by op into a :class:`DetectionPipeline`.

A pipeline is a v2 ``Compose``, a list of ops, or one of torchvision's references presets
(``DetectionPresetTrain``/``Eval``, ``SegmentationPresetTrain``/``Eval``: an object holding the
``Compose`` in ``.transforms``). Each op becomes:

- part of the output stage: ``ToImage``/``PILToTensor``/``ToTensor`` (gpufeed decodes to RGB
  arrays: which one only decides the image's type), ``ToDtype``/``ConvertImageDtype``,
  ``Normalize`` and ``ToPureTensor``;
- a gpufeed joint op of the same name and arguments (:data:`JOINT_OPS`, "fast"); a v2
  ``RandomApply``, ``RandomChoice`` or ``RandomOrder`` becomes gpufeed's container of the ops
  inside (``_containers``: each a joint op where gpufeed has one, else as given inside);
- or :class:`AsGiven`: the op itself on ``tv_tensors``, seeded from the sample ("tensor (as
  given)"): ops gpufeed has no joint op for, and every op that touches the image after the
  dtype conversion (the conversion then runs as given too, so the op sees what it saw).

Not translated (the dataset runs the pipeline as given on PIL images): a pipeline with no
conversion to tensor, ``ToPILImage``, a callable that is not torchvision's and is given a PIL
image, torchvision v1 ops (they take the image only), ops after ``ToPureTensor``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpufeed.image.detection import _affine, _boxes, _crops, _geometry, _photometric, _refs
from gpufeed.image.detection._as_given import AsGiven
from gpufeed.image.detection._containers import (
    Compose,
    Container,
    RandomApply,
    RandomChoice,
    RandomOrder,
)
from gpufeed.image.detection._fills import type_name
from gpufeed.image.detection._geometry import PIL_NEAREST, interpolation_name
from gpufeed.image.detection._pipeline import DetectionPipeline
from gpufeed.image.detection._sample import JointOp, Sample

__all__ = ["JOINT_OPS", "translate_detection"]

_TV = "torchvision.transforms"
_PRESETS = frozenset({"DetectionPresetTrain", "DetectionPresetEval", "SegmentationPresetTrain",
                      "SegmentationPresetEval"})
_CONVERSIONS = frozenset({"ToImage", "PILToTensor", "ToTensor"})
#: joint ops that touch the target only: they may follow the dtype conversion natively
_TARGET_ONLY = frozenset({"ConvertBoundingBoxFormat", "SanitizeBoundingBoxes",
                          "ClampBoundingBoxes", "ClampKeyPoints", "SanitizeKeyPoints",
                          "SetClampingMode"})

#: v2 containers whose ops gpufeed runs as joint ops when it has a joint op for each
_CONTAINERS: dict[str, type[Container]] = {
    "RandomApply": RandomApply, "RandomChoice": RandomChoice, "RandomOrder": RandomOrder}
#: ops a container cannot hold on the fast path (conversions and the output stage's ops)
_NOT_INSIDE = _CONVERSIONS | {"ToDtype", "ConvertImageDtype", "Normalize", "ToPureTensor",
                              "ToPILImage", "Lambda"}

Args = Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]]]
#: a joint op class and the constructor's arguments from a torchvision op
Entry = tuple[type[JointOp], Args]


def _attrs(*names: str) -> Args:
    """The op's attributes ``names`` as keyword arguments of the same names."""
    return lambda op: ((), {n: getattr(op, n) for n in names})


def _interp(*names: str) -> Args:
    """As :func:`_attrs`, with torchvision's ``interpolation`` and ``antialias``."""
    return _attrs(*names, "interpolation", "antialias")


def _random_crop(op: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    padding = op.padding  # stored as [left, right, top, bottom]; the argument is [l, t, r, b]
    if padding is not None:
        padding = [padding[0], padding[2], padding[1], padding[3]]
    return (), {"size": op.size, "padding": padding, "pad_if_needed": op.pad_if_needed,
                "fill": op.fill, "padding_mode": op.padding_mode}


def _iou_crop(op: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (), {"min_scale": op.min_scale, "max_scale": op.max_scale,
                "min_aspect_ratio": op.min_aspect_ratio, "max_aspect_ratio": op.max_aspect_ratio,
                "sampler_options": op.options, "trials": op.trials}


def _row_op(op: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """gpufeed's uint8 row op for an image-only torchvision op (the classification table)."""
    from gpufeed.image._recipe_table import gpufeed_op

    made = gpufeed_op(op, "uint8")
    if made is None or isinstance(made, str) or not hasattr(made, "name"):
        raise ValueError(made or f"gpufeed has no row op for {type(op).__name__}")
    return (made,), {}


_PHOTOMETRIC = ("ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomInvert",
                "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness",
                "RandomAutocontrast", "RandomEqualize")

#: torchvision op name -> (gpufeed's joint op class, the constructor's arguments from the op's
#: attributes: torchvision's public names and values). Arguments the class refuses (ValueError,
#: TypeError) run the op as given.
JOINT_OPS: dict[str, Entry] = {
    "RandomHorizontalFlip": (_geometry.RandomHorizontalFlip, _attrs("p")),
    "RandomVerticalFlip": (_geometry.RandomVerticalFlip, _attrs("p")),
    "Resize": (_geometry.Resize, _interp("size", "max_size")),
    "RandomResizedCrop": (_crops.RandomResizedCrop, _interp("size", "scale", "ratio")),
    "CenterCrop": (_crops.CenterCrop, _attrs("size")),
    "RandomCrop": (_crops.RandomCrop, _random_crop),
    "Pad": (_crops.Pad, _attrs("padding", "fill", "padding_mode")),
    "RandomZoomOut": (_crops.RandomZoomOut, _attrs("fill", "side_range", "p")),
    "RandomIoUCrop": (_crops.RandomIoUCrop, _iou_crop),
    "ScaleJitter": (_geometry.ScaleJitter, _interp("target_size", "scale_range")),
    "RandomShortestSize": (_geometry.RandomShortestSize, _interp("min_size", "max_size")),
    "RandomResize": (_geometry.RandomResize, _interp("min_size", "max_size")),
    "ConvertBoundingBoxFormat": (_boxes.ConvertBoundingBoxFormat, _attrs("format")),
    "ClampBoundingBoxes": (_boxes.ClampBoundingBoxes, _attrs("clamping_mode")),
    "ClampKeyPoints": (_boxes.ClampKeyPoints, _attrs()),
    "SanitizeBoundingBoxes": (_boxes.SanitizeBoundingBoxes,
                              _attrs("min_size", "min_area", "labels_getter")),
    "SanitizeKeyPoints": (_boxes.SanitizeKeyPoints, _attrs("labels_getter")),
    "SetClampingMode": (_boxes.SetClampingMode, _attrs("clamping_mode")),
    "RandomAffine": (_affine.RandomAffine, _attrs("degrees", "translate", "scale", "shear",
                                                  "interpolation", "fill", "center")),
    "RandomRotation": (_affine.RandomRotation,
                       _attrs("degrees", "interpolation", "expand", "center", "fill")),
    "RandomPhotometricDistort": (_photometric.RandomPhotometricDistort,
                                 _attrs("brightness", "contrast", "saturation", "hue", "p")),
    **{name: (_photometric.ImageOnly, _row_op) for name in _PHOTOMETRIC},
    # the references' segmentation helper (not torchvision's: recognised by name and shape)
    "PadIfSmaller": (_refs.PadIfSmaller, _attrs("size", "fill")),
}


def _inside(op: Any) -> list[Any]:
    """Every op inside v2 container ``op``, nested containers' too."""
    subs = [sub for item in op.transforms for sub in _flatten(item)]
    return subs + [x for sub in subs if _is_tv(sub) and type(sub).__name__ in _CONTAINERS
                   for x in _inside(sub)]


def build_container(name: str, op: Any, table: Mapping[str, Entry], kind: str = "image",
                    pil: bool = False) -> tuple[JointOp | None, str]:
    """(gpufeed's container of the ops inside v2 container ``op`` (``RandomApply``,
    ``RandomChoice``, ``RandomOrder``), "") or (None, why not: a conversion, dtype or output
    op inside). An op inside with a joint op in ``table`` runs fast, another as given on
    ``kind`` images; a ``Compose`` inside is one unit, an ``Identity`` an empty one. ``pil``:
    the container is given PIL images (see :func:`build_joint`)."""
    units: list[JointOp] = []
    for item in op.transforms:
        inner: list[JointOp] = []
        for sub in _flatten(item):
            sub_name = type(sub).__name__
            if _is_tv(sub) and sub_name == "Identity":
                continue
            if _is_v1(sub) or (_is_tv(sub) and sub_name in _NOT_INSIDE):
                return None, f"{sub_name} inside it"
            joint: JointOp | None = None
            if _is_tv(sub) and sub_name in _CONTAINERS:
                joint, _ = build_container(sub_name, sub, table, kind, pil)
            elif _is_tv(sub) or _is_ref(sub, "PadIfSmaller", "size", "fill"):
                joint, _ = build_joint(sub_name, sub, table, pil, kind)
            inner.append(joint if joint is not None else AsGiven(sub, kind))
        units.append(inner[0] if len(inner) == 1 else Compose(tuple(inner)))
    if not units:
        return None, "no op inside it"
    kwargs = {} if name == "RandomOrder" else {"p": op.p}
    try:
        return _CONTAINERS[name](tuple(units), **kwargs), ""
    except (TypeError, ValueError) as exc:
        return None, f"gpufeed's {name} cannot take these arguments ({exc})"


def build_joint(name: str, op: Any, table: Mapping[str, Entry], pil: bool = False, kind: str = "image"
                ) -> tuple[JointOp | None, str]:
    """(gpufeed's joint op for ``op`` from ``table``, "") or (None, why not). ``pil``: the op
    is given PIL images (before the conversion to tensor), where torchvision resizes the image
    with PIL (always antialiased, and nearest by PIL's own source pixels) and warps it with
    PIL's affine transform. A ``fill`` dict's entry for the image is the one torchvision looks
    up by the image's type there: ``PIL.Image.Image`` (``pil``), ``tv_tensors.Image`` (``kind``
    "image", after ``ToImage``) or ``torch.Tensor`` ("tensor", after ``PILToTensor``), else
    "others"."""
    entry = table.get(name)
    if entry is None:
        return None, "no gpufeed joint op"
    cls, args = entry
    try:
        pos, kw = args(op)
        if pil and "antialias" in kw:
            kw["antialias"] = True
            if interpolation_name(kw["interpolation"]) == "nearest":
                kw["interpolation"] = PIL_NEAREST
        if pil and name in ("RandomAffine", "RandomRotation"):
            kw["pil"] = True  # the image warped by PIL
        if isinstance(kw.get("fill"), Mapping):
            kw["fill"] = _stage_fill(kw["fill"], "pil" if pil else kind)
        return cls(*pos, **kw), ""
    except (TypeError, ValueError, AttributeError) as exc:
        return None, f"gpufeed's {cls.__name__} cannot take these arguments ({exc})"


def _image_key(key: Any, stage: str) -> bool:
    """Whether ``key`` of a fill dict is the type of the image at ``stage``."""
    module, name = getattr(key, "__module__", ""), getattr(key, "__name__", None)
    if stage == "pil":
        return module.startswith("PIL") and name == "Image"
    if stage == "tensor":
        return key is torch.Tensor
    return module.startswith("torchvision") and name == "Image"


def _stage_fill(fill: Mapping[Any, Any], stage: str) -> dict[Any, Any]:
    """``fill`` with one image entry ("Image", the name gpufeed's joint ops look the image's
    fill up by): the value of the key that is the image's type at ``stage``, else of
    "others" (torchvision's ``_get_fill(fill, type(image))``), else none."""
    out = {k: v for k, v in fill.items() if type_name(k) not in ("Image", "Tensor")}
    image = [v for k, v in fill.items() if _image_key(k, stage)]
    if image or "others" in fill:
        out["Image"] = image[0] if image else fill["others"]
    return out


def _is_tv(op: Any) -> bool:
    return type(op).__module__.startswith(_TV)


def _is_v1(op: Any) -> bool:
    return _is_tv(op) and not type(op).__module__.startswith(_TV + ".v2")


def _preset_inner(obj: Any) -> Any:
    if type(obj).__name__ in _PRESETS and callable(obj) and hasattr(obj, "transforms"):
        return obj.transforms
    return None


def _flatten(obj: Any) -> list[Any]:
    inner = _preset_inner(obj)
    if inner is not None:
        return _flatten(inner)
    if isinstance(obj, (list, tuple)):
        return [op for item in obj for op in _flatten(item)]
    if type(obj).__name__ == "Compose" and _is_tv(obj) and hasattr(obj, "transforms"):
        return [op for item in obj.transforms for op in _flatten(item)]
    return [obj]


def _is_ref(op: Any, name: str, *attrs: str) -> bool:
    """True for the references' own class ``name`` (not torchvision's), recognised by shape."""
    return type(op).__name__ == name and not _is_tv(op) and all(hasattr(op, a) for a in attrs)


def _dtypes(op: Any, kind: str) -> tuple[torch.dtype, torch.dtype | None] | None:
    """(image dtype, mask dtype or None) of a ``ToDtype``/``ConvertImageDtype`` the output stage
    can apply (uint8 or float images). A dict may name Image, Tensor, Mask and "others": None;
    the image is an Image after ``ToImage`` (``kind`` "image"), a plain tensor ("Tensor") after
    ``PILToTensor``, and a dict without its key leaves it as it is (uint8), as torchvision's
    "others": None does."""
    dtype = op.dtype
    mask = None
    if isinstance(dtype, Mapping):
        by_name = {type_name(k): v for k, v in dtype.items()}
        if set(by_name) - {"Image", "Tensor", "Mask", "others"} or by_name.get("others") is not None:
            return None
        dtype, mask = by_name.get("Image" if kind == "image" else "Tensor", torch.uint8), by_name.get("Mask")
    if not isinstance(dtype, torch.dtype) or not (dtype == torch.uint8 or dtype.is_floating_point):
        return None
    return dtype, mask


@dataclass
class _Walk:
    """What the ops said so far (one pass in order)."""

    table: Mapping[str, Entry]
    ops: list[JointOp] = field(default_factory=list)
    fallback: list[JointOp] = field(default_factory=list)
    routes: list[tuple[str, str]] = field(default_factory=list)  # (op name, where/why)
    blocker: str = ""
    converted: bool = False  # past ToImage/PILToTensor/ToTensor
    kind: str = "image"  # what an op as given receives as the image (after the conversion)
    image_dtype: torch.dtype | None = None
    scale: bool = True
    mask_dtype: torch.dtype | None = None
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    stage: list[Any] = field(default_factory=list)  # ToDtype/Normalize ops held by the stage
    flushed: bool = False  # the image is float in the ops (the dtype conversion ran as given)
    pure: bool = False

    def given(self, op: Any, note: str, kind: str | None = None) -> None:
        joint = AsGiven(op, kind or self.kind)
        self.ops.append(joint)
        self.fallback.append(joint)
        self.routes.append((type(op).__name__, f"{joint.where}: {note}"))

    def flush(self) -> None:
        """An op that touches the image follows the dtype conversion: the conversion (and
        Normalize) run as given before it, where the pipeline has them."""
        if self.stage:
            for op in self.stage:  # ToTensor passes tensors through: its conversion instead
                joint = _ToTensorFloat() if type(op).__name__ == "ToTensor" else AsGiven(op, self.kind)
                self.ops.append(joint)
                self.fallback.append(joint)
            names = ", ".join(type(op).__name__ for op in self.stage)
            self.routes.append((names, "tensor (as given): an op that touches the image follows"))
            self.stage.clear()
        self.normalize, self.mask_dtype = None, None
        self.flushed = self.image_dtype is not None and self.image_dtype.is_floating_point


class _ToTensorFloat(JointOp):
    """``ToTensor``'s conversion (float32, divided by 255) of the sample's uint8 image, for a
    ``ToTensor`` followed by an op run as given (``ToTensor`` itself passes tensors through)."""

    name = "ToTensor"
    where = "fast"

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return True

    def apply(self, sample: Sample, params: Any) -> Sample:
        image = sample.image.astype(np.float32) / np.float32(255)
        return Sample(image, sample.target)

    def __repr__(self) -> str:
        return "ToTensor()"


def _walk(walk: _Walk, op: Any, pil: bool) -> None:
    name = type(op).__name__
    tv = _is_tv(op)
    if walk.pure:
        walk.blocker = f"{name} after ToPureTensor (ops there see plain tensors)"
    elif tv and name == "ToPILImage":
        walk.blocker = "ToPILImage: the pipeline works on PIL images"
    elif tv and _is_v1(op):
        walk.blocker = f"{name} is a torchvision.transforms (v1) op, which takes the image only"
    elif tv and name == "Lambda" and pil and not walk.converted:
        walk.blocker = "Lambda given a PIL image (its function may need one)"
    elif tv and name in _CONTAINERS and pil and not walk.converted and any(
            type(sub).__name__ == "Lambda" if _is_tv(sub) else not _is_ref(sub, "PadIfSmaller", "size", "fill")
            for sub in _inside(op)):
        walk.blocker = f"{name} holds a callable that is not torchvision's, given a PIL image"
    elif tv and name in _CONVERSIONS:
        _conversion(walk, op, name)
    elif tv and name in ("ToDtype", "ConvertImageDtype"):
        _to_dtype(walk, op, name)
    elif tv and name == "Normalize":
        _normalize(walk, op)
    elif tv and name == "Identity":
        walk.routes.append((name, "fast: no-op"))
    elif tv and name == "ToPureTensor":
        walk.pure = True
        walk.routes.append((name, "fast: output stage (plain tensors)"))
    elif tv or _is_ref(op, "PadIfSmaller", "size", "fill"):
        _joint(walk, op, name, pil and not walk.converted)
    elif _is_ref(op, "FixedSizeCrop", "crop_height", "crop_width", "fill"):
        if walk.image_dtype is not None:
            walk.flush()
        walk.given(op, "the references' class, run on what the pipeline gives it",
                   kind="pil" if pil and not walk.converted else None)
    elif pil and not walk.converted:
        walk.blocker = f"{name}: a callable that is not torchvision's, given a PIL image"
    else:
        if walk.image_dtype is not None:
            walk.flush()
        walk.given(op, "not a torchvision op")


def _conversion(walk: _Walk, op: Any, name: str) -> None:
    if name == "ToTensor":
        if walk.converted:
            walk.blocker = "ToTensor after the conversion to tensor"
            return
        walk.image_dtype = torch.float32
        walk.stage.append(op)
    if name == "ToImage" or not walk.converted:
        walk.kind = "image" if name == "ToImage" else "tensor"
    walk.converted = True
    image = "tv_tensors.Image" if walk.kind == "image" else "a plain tensor"
    walk.routes.append((name, f"fast: the decoded RGB array; the image is {image}"))


def _to_dtype(walk: _Walk, op: Any, name: str) -> None:
    dtypes = _dtypes(op, walk.kind)
    scale = name == "ConvertImageDtype" or bool(getattr(op, "scale", False))
    if not walk.converted:
        walk.blocker = f"{name} before the conversion to tensor (the image is a PIL image there)"
    elif dtypes is None or walk.flushed or walk.image_dtype is not None:
        walk.flush()
        walk.given(op, "a dtype conversion the output stage does not hold")
        walk.flushed = True
    else:
        walk.image_dtype, walk.mask_dtype = dtypes
        walk.scale = scale
        walk.stage.append(op)
        walk.routes.append((name, f"fast: output stage ({walk.image_dtype})"))


def _normalize(walk: _Walk, op: Any) -> None:
    try:
        mean = tuple(float(v) for v in op.mean)
        std = tuple(float(v) for v in op.std)
    except (TypeError, ValueError):
        mean, std = (), ()
    ok = (walk.image_dtype is not None and walk.image_dtype.is_floating_point and not walk.flushed
          and walk.normalize is None and len(mean) in (1, 3) and len(std) in (1, 3) and 0.0 not in std)
    if not ok:
        if walk.image_dtype is not None:
            walk.flush()
        walk.given(op, "not after a float dtype conversion held by the output stage")
        return
    walk.normalize = (mean * (3 // len(mean)), std * (3 // len(std)))
    walk.stage.append(op)
    walk.routes.append(("Normalize", "fast: output stage"))


def _joint(walk: _Walk, op: Any, name: str, pil: bool) -> None:
    if walk.image_dtype is not None and name not in _TARGET_ONLY:
        walk.flush()
    if walk.flushed:
        walk.given(op, "the image is float here")
        return
    if name in _CONTAINERS:
        joint, why = build_container(name, op, walk.table, walk.kind, pil)
    else:
        joint, why = build_joint(name, op, walk.table, pil, walk.kind)
    if joint is None:
        walk.given(op, why)
        return
    walk.ops.append(joint)
    walk.fallback.append(AsGiven(op, walk.kind))
    what = f"gpufeed container of {joint.describe()}" if isinstance(joint, Container) else "gpufeed joint op"
    walk.routes.append((name, f"{getattr(joint, 'where', 'fast')}: {what}"))


def translate_detection(pipeline: Any, *, table: Mapping[str, Entry] | None = None
                        ) -> tuple[DetectionPipeline | None, str]:
    """(the translation, or None when the pipeline must run as given on PIL images; a one-line
    report of where each op runs). ``table``: the joint ops to use (default :data:`JOINT_OPS`;
    ``{}`` runs every op but the conversions and the output stage as given)."""
    ops = _flatten(pipeline)
    walk = _Walk(JOINT_OPS if table is None else table)
    conv = [i for i, op in enumerate(ops) if _is_tv(op) and type(op).__name__ in _CONVERSIONS]
    if not any(_is_tv(op) for op in ops):
        return None, ("detection transforms run as given on PIL images: not a torchvision v2 "
                      "pipeline (a callable gpufeed cannot look into)")
    if not conv:
        return None, ("detection pipeline runs as given on PIL images: no ToImage/PILToTensor: "
                      "it returns PIL images")
    pil = conv[0] > 0  # ops before the conversion are given PIL images
    for op in ops:
        _walk(walk, op, pil)
        if walk.blocker:
            return None, f"detection pipeline runs as given on PIL images: {walk.blocker}"
    image_dtype = torch.uint8 if walk.image_dtype is None else walk.image_dtype
    out = DetectionPipeline(ops=tuple(walk.ops), image_dtype=image_dtype, scale=walk.scale,
                            normalize=walk.normalize, mask_dtype=walk.mask_dtype, pure=walk.pure,
                            plain_image=walk.kind == "tensor", fallback=tuple(walk.fallback),
                            source=pipeline)
    fast = sum(1 for _, where in walk.routes if where.startswith("fast"))
    lines = "; ".join(f"{name}: {where}" for name, where in walk.routes)
    return out, (f"detection pipeline translated ({fast} of {len(walk.routes)} ops fast; "
                 f"output: {out.output_text()}): {lines}")
