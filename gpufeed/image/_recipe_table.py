"""torchvision and timm augmentation ops -> gpufeed's own ops (``gpufeed.image.augment``), with the
same parameters.

:func:`gpufeed_op` returns the gpufeed op for a recognised op, a string saying why the op's
parameters or position cannot be taken, or None for an op gpufeed does not have (the caller
then runs it as given on the row where it accepts tensors: ``gpufeed.image._recipe_ops``).
Ops are recognised by class name and module (neither torchvision nor timm is imported here).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["TIMM_PREFIX", "TV_PREFIX", "gpufeed_op"]

TV_PREFIX = "torchvision.transforms"
TIMM_PREFIX = "timm.data"

Made = Any  # a RowOp, a FloatRowOp, a reason (str) or None


def _augment() -> Any:
    return importlib.import_module("gpufeed.image.augment")


def _make(cls_name: str, /, **kwargs: Any) -> Made:
    """``gpufeed.image.augment.<cls_name>(**kwargs)``; None when gpufeed has no such op, the error's
    text when it refuses the parameters."""
    try:
        cls = getattr(_augment(), cls_name)
    except (ImportError, AttributeError):
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        return f"gpufeed.image.augment.{cls_name} cannot take these parameters ({exc})"


def _interp(value: Any) -> str:
    """An InterpolationMode / PIL resample / str as gpufeed's name ("nearest", "bilinear"...)."""
    raw = getattr(value, "value", value)
    if isinstance(raw, int):
        return {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(raw, str(raw))
    return str(raw).lower()


def _fill(value: Any) -> Any:
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, dict):  # v2: {type: fill}; gpufeed fills images only
        picked = [v for k, v in value.items() if getattr(k, "__name__", k) in ("Image", "Tensor")]
        return picked[0] if len(picked) == 1 else value
    return tuple(value)


def _range(value: Any) -> Any:
    return None if value is None else tuple(float(v) for v in value)


def _color_jitter(op: Any, domain: str) -> Made:
    return _make("ColorJitter", brightness=_range(op.brightness), contrast=_range(op.contrast),
                 saturation=_range(op.saturation), hue=_range(op.hue))


def _threshold(op: Any, domain: str) -> Made:
    threshold = float(op.threshold)
    if domain in ("float", "normalized"):  # torchvision thresholds a float image on the 0-1 scale
        threshold *= 255.0
    return _make("RandomSolarize", threshold=threshold, p=float(op.p))


def _erasing(op: Any, domain: str) -> Made:
    if domain != "normalized":
        return "RandomErasing before Normalize (gpufeed erases the normalized rows)"
    value = op.value
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    elif isinstance(value, (list, tuple)):
        value = tuple(float(v) for v in value)
    return _make("RandomErasing", p=float(op.p), scale=tuple(op.scale), ratio=tuple(op.ratio),
                 value=value)


def _timm_erasing(op: Any, domain: str) -> Made:
    if domain != "normalized":
        return "RandomErasing before Normalize (gpufeed erases the normalized rows)"
    import math

    lo, hi = op.log_aspect_ratio
    if getattr(op, "num_splits", 0):
        return "RandomErasing(num_splits>0) treats batch splits differently (augmix)"
    min_aspect, max_aspect = math.exp(lo), math.exp(hi)
    return _make("TimmRandomErasing", probability=float(op.probability),
                 min_area=float(op.min_area), max_area=float(op.max_area), min_aspect=min_aspect,
                 max_aspect=None if math.isclose(max_aspect, 1 / min_aspect) else max_aspect,
                 mode=op.mode,
                 min_count=int(op.min_count), max_count=int(op.max_count))


def _rotation(op: Any, domain: str) -> Made:
    if getattr(op, "expand", False) or getattr(op, "center", None) is not None:
        return "RandomRotation with expand=True or a center other than the image's"
    return _make("RandomRotation", degrees=tuple(float(d) for d in op.degrees),
                 interpolation=_interp(op.interpolation), fill=_fill(op.fill))


def _floats(value: Any) -> Any:
    return None if value is None else tuple(float(v) for v in value)


def _affine(op: Any, domain: str) -> Made:
    if getattr(op, "center", None) is not None:
        return "RandomAffine with a center other than the image's"
    return _make("RandomAffine", degrees=_floats(op.degrees), translate=_floats(op.translate),
                 scale=_floats(op.scale), shear=_floats(op.shear),
                 interpolation=_interp(op.interpolation), fill=_fill(op.fill))


def _policy(cls_name: str, *names: str) -> Callable[[Any, str], Made]:
    def build(op: Any, domain: str) -> Made:
        kwargs = {n: getattr(op, n) for n in names}
        kwargs["interpolation"] = _interp(op.interpolation)
        kwargs["fill"] = _fill(op.fill)
        if "policy" in kwargs:
            kwargs["policy"] = getattr(kwargs["policy"], "name", kwargs["policy"]).lower()
        return _make(cls_name, **kwargs)
    return build


def _simple(cls_name: str, **attrs: str) -> Callable[[Any, str], Made]:
    def build(op: Any, domain: str) -> Made:
        return _make(cls_name, **{k: getattr(op, v) for k, v in attrs.items()})
    return build


def _timm_policy(cls_name: str) -> Callable[[Any, str], Made]:
    def build(op: Any, domain: str) -> Made:
        try:
            cls = getattr(_augment(), cls_name)
            from_timm = cls.from_timm
        except (ImportError, AttributeError):
            return None
        try:
            made: Made = from_timm(op)
        except (TypeError, ValueError) as exc:
            return f"gpufeed.image.augment.{cls_name}.from_timm cannot take this policy ({exc})"
        return made
    return build


def _inner(op: Any, domain: str) -> Made:
    """gpufeed's ops for the ops of container ``op`` (a tuple of RowOps), or why not / None."""
    made = []
    for inner in op.transforms:
        got = gpufeed_op(inner, domain)
        if got is None or isinstance(got, str):
            return got
        if not isinstance(got, _augment().RowOp):
            return f"{type(inner).__name__} inside {type(op).__name__} runs on the float rows"
        made.append(got)
    return tuple(made)


def _random_apply(op: Any, domain: str) -> Made:
    inner = _inner(op, domain)
    return inner if not isinstance(inner, tuple) else _make("RandomApply", transforms=inner,
                                                             p=float(op.p))


def _random_choice(op: Any, domain: str) -> Made:
    inner = _inner(op, domain)
    weights = getattr(op, "p", None)
    return inner if not isinstance(inner, tuple) else _make(
        "RandomChoice", transforms=inner, p=None if weights is None else tuple(weights))


def _random_order(op: Any, domain: str) -> Made:
    inner = _inner(op, domain)
    return inner if not isinstance(inner, tuple) else _make("RandomOrder", transforms=inner)


_TORCHVISION: dict[str, Callable[[Any, str], Made]] = {
    "RandomApply": _random_apply,
    "RandomChoice": _random_choice,
    "RandomOrder": _random_order,
    "ColorJitter": _color_jitter,
    "RandomGrayscale": _simple("RandomGrayscale", p="p"),
    "GaussianBlur": _simple("GaussianBlur", kernel_size="kernel_size", sigma="sigma"),
    "RandomSolarize": _threshold,
    "RandomPosterize": _simple("RandomPosterize", bits="bits", p="p"),
    "RandomEqualize": _simple("RandomEqualize", p="p"),
    "RandomAutocontrast": _simple("RandomAutocontrast", p="p"),
    "RandomInvert": _simple("RandomInvert", p="p"),
    "RandomAdjustSharpness": _simple("RandomAdjustSharpness", sharpness_factor="sharpness_factor",
                                     p="p"),
    "RandomHorizontalFlip": _simple("RandomHorizontalFlip", p="p"),
    "RandomVerticalFlip": _simple("RandomVerticalFlip", p="p"),
    "RandomRotation": _rotation,
    "RandomAffine": _affine,
    "TrivialAugmentWide": _policy("TrivialAugmentWide", "num_magnitude_bins"),
    "RandAugment": _policy("RandAugment", "num_ops", "magnitude", "num_magnitude_bins"),
    "AutoAugment": _policy("AutoAugment", "policy"),
    "RandomErasing": _erasing,
    "AugMix": _policy("AugMix", "severity", "mixture_width", "chain_depth", "alpha", "all_ops"),
}
_TIMM: dict[str, Callable[[Any, str], Made]] = {
    "RandAugment": _timm_policy("TimmRandAugment"),
    "AutoAugment": _timm_policy("TimmAutoAugment"),
    "RandomErasing": _timm_erasing,
    "AugMixAugment": _timm_policy("TimmAugMix"),
}


def gpufeed_op(op: Any, domain: str) -> Made:
    """gpufeed's op for torchvision's or timm's ``op`` seen in ``domain`` (see
    ``gpufeed.image._recipe_ops``), a reason it cannot be taken, or None (no such gpufeed op)."""
    module, name = type(op).__module__, type(op).__name__
    table = _TIMM if module.startswith(TIMM_PREFIX) else _TORCHVISION
    build = table.get(name)
    return None if build is None else build(op, domain)
