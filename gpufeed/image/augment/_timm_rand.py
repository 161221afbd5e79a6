"""timm's RandAugment (``rand-m9-mstd0.5-inc1`` and the rest of its config strings) on uint8 rows.

What timm's ``RandAugment`` and ``AugmentOp`` draw, with the same distributions: ``num_layers``
ops chosen uniformly with replacement; each applied with probability ``prob``; its magnitude
``m``, or Gaussian(m, mstd) (uniform in [0, m] for mstd > 100), clipped to [0, mmax or 10]; the
op's level function (timm's ``LEVEL_TO_ARG``); a random sign where timm negates; for warps, a
random choice of bilinear/bicubic unless ``interpolation`` fixes it. ``params`` is
((op name, args, interpolation), ...). Pixels are computed as timm's PIL calls compute them
(:mod:`~gpufeed.image.augment._functional`, :mod:`~gpufeed.image.augment._warp`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment import _functional as fn
from gpufeed.image.augment import _warp
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._checks import check_fill, check_int, check_number, check_p

__all__ = ["TIMM_KNOWN", "TIMM_RAND_3A", "TIMM_RAND_INCREASING", "TIMM_RAND_OPS", "TimmRandAugment",
           "apply_timm_op", "draw_timm_op", "pil_interp"]

_DENOM = 10.0  # timm's _LEVEL_DENOM

TIMM_RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                 "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX",
                 "ShearY", "TranslateXRel", "TranslateYRel")
TIMM_RAND_INCREASING = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                        "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing",
                        "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
                        "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
#: timm's "3a" op set (``rand-...-t3a``), DeiT III's three augmentations as RandAugment ops
TIMM_RAND_3A = ("SolarizeIncreasing", "Desaturate", "GaussianBlur")
# timm's weighted op sets (``t3aw``, ``tweights``): op -> relative weight, in timm's order
_WEIGHTED: dict[str, dict[str, float]] = {
    "3aw": {"SolarizeIncreasing": 6, "Desaturate": 6, "GaussianBlur": 6, "Rotate": 3, "ShearX": 2,
            "ShearY": 2, "PosterizeIncreasing": 1, "AutoContrast": 1, "ColorIncreasing": 1,
            "SharpnessIncreasing": 1, "ContrastIncreasing": 1, "BrightnessIncreasing": 1,
            "Equalize": 1, "Invert": 1},
    "weights": {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
                "ColorIncreasing": 0.25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
                "SolarizeIncreasing": 0.05, "SolarizeAdd": 0.05, "ContrastIncreasing": 0.05,
                "BrightnessIncreasing": 0.05, "Equalize": 0.05, "PosterizeIncreasing": 0.05,
                "Invert": 0.05},
}
_WARPS = frozenset({"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel",
                    "TranslateYRel"})
_NEGATED = frozenset({"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel",
                      "TranslateYRel", "ColorIncreasing", "ContrastIncreasing",
                      "BrightnessIncreasing", "SharpnessIncreasing"})
#: the timm op names gpufeed has
TIMM_KNOWN = _KNOWN = frozenset(TIMM_RAND_OPS) | frozenset(TIMM_RAND_INCREASING) | {
    "PosterizeOriginal", "TranslateX", "TranslateY", "Desaturate", "GaussianBlur",
    "GaussianBlurRand"}


def _level(name: str, m: float, negate: bool, translate_pct: float,
           translate_const: float) -> tuple[float, ...]:
    """timm's ``LEVEL_TO_ARG[name](m)``, with ``negate`` for the ops timm negates at random."""
    sign = -1.0 if negate else 1.0
    if name in ("AutoContrast", "Equalize", "Invert"):
        return ()
    if name == "Rotate":
        return (sign * (m / _DENOM) * 30.0,)
    if name in ("ShearX", "ShearY"):
        return (sign * (m / _DENOM) * 0.3,)
    if name in ("TranslateXRel", "TranslateYRel"):
        return (sign * (m / _DENOM) * translate_pct,)
    if name in ("TranslateX", "TranslateY"):
        return (sign * (m / _DENOM) * float(translate_const),)
    if name == "Posterize":
        return (int((m / _DENOM) * 4),)
    if name == "PosterizeIncreasing":
        return (4 - int((m / _DENOM) * 4),)
    if name == "PosterizeOriginal":
        return (int((m / _DENOM) * 4) + 4,)
    if name == "Solarize":
        return (min(256, int((m / _DENOM) * 256)),)
    if name == "SolarizeIncreasing":
        return (256 - min(256, int((m / _DENOM) * 256)),)
    if name == "SolarizeAdd":
        return (min(128, int((m / _DENOM) * 110)),)
    if name == "Desaturate":  # timm's _minmax_level_to_arg, [0.5, 1]
        return (max(0.5, min(1.0, 0.5 + 0.5 * (m / _DENOM))),)
    if name == "GaussianBlur":  # [0.1, 2]
        return (max(0.1, min(2.0, 0.1 + 1.9 * (m / _DENOM))),)
    if name == "GaussianBlurRand":  # [0, 1]
        return (max(0.0, min(1.0, m / _DENOM)),)
    if name.endswith("Increasing"):  # Color/Contrast/Brightness/Sharpness
        return (max(0.1, 1.0 + sign * (m / _DENOM) * 0.9),)
    return ((m / _DENOM) * 1.8 + 0.1,)  # Color, Contrast, Brightness, Sharpness


def draw_timm_op(rng: np.random.Generator, name: str, prob: float, magnitude: float,
                 magnitude_std: float, magnitude_max: float | None, interpolation: str,
                 translate_pct: float, translate_const: float) -> tuple[str, tuple[float, ...], str] | None:
    """What timm's ``AugmentOp(name, prob, magnitude)`` draws, in its order: whether it applies
    (None: not), the magnitude noise (inf: uniform in [0, m]), the clip to [0, mmax or 10], the
    sign, the warp's interpolation ("random": bilinear or bicubic), and for GaussianBlurRand the
    radius its op draws, uniform(0.1, 2 x level) as Python's ``random.uniform`` computes it
    (its args are that radius). Returns (name, level args, interpolation), what
    :func:`apply_timm_op` takes."""
    if prob < 1.0 and rng.random() > prob:
        return None
    m = magnitude
    if magnitude_std == math.inf:
        m = float(rng.uniform(0, m))
    elif magnitude_std > 0:
        m = float(rng.normal(m, magnitude_std))
    m = max(0.0, min(m, magnitude_max or _DENOM))
    negate = name in _NEGATED and rng.random() > 0.5
    interp = interpolation
    if name in _WARPS and interp == "random":
        interp = ("bilinear", "bicubic")[int(rng.integers(2))]
    args = _level(name, m, negate, translate_pct, translate_const)
    if name == "GaussianBlurRand":
        args = (0.1 + (2.0 * args[0] - 0.1) * float(rng.random()),)
    return name, args, interp


_ENHANCE = {"Color": fn.color, "Contrast": fn.contrast, "Brightness": fn.brightness,
            "Sharpness": fn.sharpness}


def apply_timm_op(row: np.ndarray, name: str, args: tuple[float, ...], interpolation: str,
                  fill: tuple[int, int, int]) -> np.ndarray:
    """timm's ``NAME_TO_OP[name](img, *args)`` on a uint8 (H, W, 3) row (GaussianBlurRand: its
    drawn radius, as :func:`draw_timm_op` gives it)."""
    h, w = row.shape[:2]
    base = name.replace("Increasing", "").replace("Original", "")
    if name in _WARPS:
        v = args[0]
        if name == "Rotate":
            matrix = _warp.rotate_matrix(v, h, w)
        elif name == "ShearX":
            matrix = (1.0, v, 0.0, 0.0, 1.0, 0.0)
        elif name == "ShearY":
            matrix = (1.0, 0.0, 0.0, v, 1.0, 0.0)
        elif name.startswith("TranslateX"):
            matrix = (1.0, 0.0, v * w if name.endswith("Rel") else v, 0.0, 1.0, 0.0)
        else:
            matrix = (1.0, 0.0, 0.0, 0.0, 1.0, v * h if name.endswith("Rel") else v)
        return _warp.warp(row, matrix, fill, interpolation)
    if base in _ENHANCE:
        return _ENHANCE[base](row, args[0])
    if base == "Posterize":
        return fn.posterize(row, int(args[0]))
    if base == "Solarize":
        return fn.solarize(row, args[0])
    if name == "SolarizeAdd":
        return fn.solarize_add(row, int(args[0]), 128)
    if name == "AutoContrast":
        return fn.autocontrast(row)
    if name == "Equalize":
        return fn.equalize(row)
    if name == "Invert":
        return fn.invert(row)
    if name == "Desaturate":  # Color(1 - level), 0: the grey image
        factor = min(1.0, max(0.0, 1.0 - args[0]))
        return fn.grayscale(row) if factor == 0.0 else fn.color(row, factor)
    if name in ("GaussianBlur", "GaussianBlurRand"):
        return fn.pil_gaussian_blur(row, args[0])
    raise ValueError(f"unknown timm RandAugment op {shorten(name)}; known: {sorted(_KNOWN)}.")


def check_timm_hparams(policy: Any) -> None:
    """Check the settings timm's RandAugment and AutoAugment share, on the frozen dataclass
    ``policy`` (``magnitude_std`` becomes a float, ``fill`` an RGB tuple); ValueError otherwise."""
    std = policy.magnitude_std
    if isinstance(std, bool) or not (isinstance(std, (int, float)) and std >= 0):
        raise ValueError(f"`magnitude_std` must be >= 0 (inf: uniform). Found: {shorten(std)}.")
    object.__setattr__(policy, "magnitude_std", float(std))
    if policy.magnitude_max is not None:
        check_number(policy.magnitude_max, "magnitude_max", 0)
    check_number(policy.translate_pct, "translate_pct", 0)
    check_number(policy.translate_const, "translate_const", 0)
    object.__setattr__(policy, "fill", check_fill(policy.fill))
    if policy.interpolation not in ("random", "nearest", "bilinear", "bicubic"):
        raise ValueError(f"`interpolation` must be 'random', 'nearest', 'bilinear' or "
                         f"'bicubic'. Found: {shorten(policy.interpolation)}.")


@dataclass(frozen=True)
class TimmRandAugment(RowOp):
    """timm's ``rand_augment_transform``: build it from a config string with
    :meth:`from_config` (``"rand-m9-mstd0.5-inc1"``) or from timm's object with
    :meth:`from_timm`. ``fill`` is timm's ``img_mean`` (default (128, 128, 128));
    ``interpolation`` "random" (bilinear or bicubic per warp, timm's default), or one of
    "nearest", "bilinear", "bicubic" (timm's ``hparams['interpolation']``). ``weights``: None
    (ops chosen uniformly, with replacement) or one weight >= 0 per op (timm's
    ``choice_weights``: ``num_layers`` distinct ops, each in turn with probability its weight
    over the remaining ones')."""

    ops: tuple[str, ...] = TIMM_RAND_OPS
    num_layers: int = 2
    magnitude: float = 10.0
    prob: float = 0.5
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    translate_pct: float = 0.45
    translate_const: float = 250.0
    fill: Any = (128, 128, 128)
    interpolation: str = "random"
    weights: Any = None
    name = "RandAugment(timm)"

    def __post_init__(self) -> None:
        ops = tuple(self.ops)
        unknown = [op for op in ops if op not in _KNOWN]
        if not ops or unknown:
            raise ValueError(f"`ops` must be timm RandAugment op names ({sorted(_KNOWN)}). "
                             f"Found: {shorten(self.ops)}.")
        object.__setattr__(self, "ops", ops)
        check_int(self.num_layers, "num_layers", 0)
        object.__setattr__(self, "magnitude", check_number(self.magnitude, "magnitude", 0))
        object.__setattr__(self, "prob", check_p(self.prob, "prob"))
        check_timm_hparams(self)
        if self.weights is not None:
            object.__setattr__(self, "weights", _check_weights(self.weights, ops, self.num_layers))

    @classmethod
    def from_config(cls, config: str, *, fill: Any = (128, 128, 128),
                    interpolation: str = "random", translate_pct: float = 0.45,
                    translate_const: float = 250.0) -> TimmRandAugment:
        """timm's ``rand_augment_transform(config, hparams)``: sections ``m`` (magnitude), ``n``
        (layers), ``p`` (probability), ``mstd`` (magnitude noise; > 100: uniform), ``mmax``,
        ``inc`` (the increasing ops), ``t3a`` (the op set :data:`TIMM_RAND_3A`; timm's other
        names give the default set, as in timm), ``t3aw`` and ``tweights`` (timm's weighted
        sets)."""
        parts = config.split("-") if isinstance(config, str) else []
        if not parts or parts[0] != "rand":
            raise ValueError(f"a timm RandAugment config starts with 'rand' (e.g. "
                             f"'rand-m9-mstd0.5-inc1'). Found: {shorten(config)}.")
        magnitude, layers, prob, std, mmax, inc = _DENOM, 2, 0.5, 0.0, None, False
        choice = None
        for part in parts[1:]:
            if part.startswith("t"):  # the first one counts, as in timm
                choice = part[1:] if choice is None else choice
                continue
            pieces = re.split(r"(\d.*)", part)
            if len(pieces) < 2:
                continue
            key, value = pieces[:2]
            try:
                if key == "mstd":
                    std = float(value)
                    std = math.inf if std > 100 else std
                elif key == "mmax":
                    mmax = int(value)
                elif key == "inc":
                    inc = bool(int(value))
                elif key == "m":
                    magnitude = int(value)
                elif key == "n":
                    layers = int(value)
                elif key == "p":
                    prob = float(value)
                else:
                    raise ValueError(f"unknown section {key!r}")
            except ValueError as exc:
                raise ValueError(f"cannot read timm RandAugment config {shorten(config)} at "
                                 f"{part!r}: {exc}. Sections: m, n, p, mstd, mmax, inc, t.") from None
        weighted = _WEIGHTED.get(choice or "")
        ops: tuple[str, ...] = (TIMM_RAND_3A if choice == "3a" else
                                TIMM_RAND_INCREASING if inc else TIMM_RAND_OPS)
        weights = None
        if weighted is not None:  # normalized as timm normalizes them
            ops, raw = tuple(weighted), np.array(list(weighted.values()))
            weights = tuple(float(w) for w in raw / np.sum(raw))
        return cls(ops=ops, num_layers=layers, weights=weights,
                   magnitude=float(magnitude), prob=prob, magnitude_std=std, magnitude_max=mmax,
                   translate_pct=translate_pct, translate_const=translate_const, fill=fill,
                   interpolation=interpolation)

    @classmethod
    def from_timm(cls, transform: Any) -> TimmRandAugment:
        """The same op as timm's ``RandAugment`` object ``transform`` (its ops, layers and
        hparams and choice weights are read; timm is not imported)."""
        weights = getattr(transform, "choice_weights", None)
        ops = list(transform.ops)
        if not ops:
            raise ValueError("timm's RandAugment has no ops.")
        first = ops[0]
        hp = dict(first.hparams)
        resample = first.kwargs.get("resample")
        interp = "random" if isinstance(resample, (tuple, list)) else pil_interp(resample)
        for op in ops[1:]:
            if (op.prob, op.magnitude, op.magnitude_std, op.magnitude_max) != (
                    first.prob, first.magnitude, first.magnitude_std, first.magnitude_max):
                raise ValueError("timm RandAugment ops with different settings are not on the "
                                 "fast path.")
        return cls(ops=tuple(op.name for op in ops), num_layers=int(transform.num_layers),
                   magnitude=float(first.magnitude), prob=float(first.prob),
                   magnitude_std=float(first.magnitude_std), magnitude_max=first.magnitude_max,
                   translate_pct=float(hp.get("translate_pct", 0.45)),
                   translate_const=float(hp.get("translate_const", 250)),
                   fill=first.kwargs.get("fillcolor", (128, 128, 128)), interpolation=interp,
                   weights=None if weights is None else tuple(float(w) for w in weights))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        if self.weights is None:
            chosen = rng.integers(len(self.ops), size=self.num_layers)
        else:
            p = np.asarray(self.weights)
            chosen = rng.choice(len(self.ops), size=self.num_layers, replace=False, p=p / p.sum())
        drawn = (draw_timm_op(rng, self.ops[int(k)], self.prob, self.magnitude,
                              self.magnitude_std, self.magnitude_max, self.interpolation,
                              self.translate_pct, self.translate_const) for k in chosen)
        return tuple(d for d in drawn if d is not None)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        for name, args, interp in params:
            row = apply_timm_op(row, name, args, interp, self.fill)
        return row


def _check_weights(weights: Any, ops: tuple[str, ...], num_layers: int) -> tuple[float, ...]:
    """One weight >= 0 per op, at least ``num_layers`` of them > 0, as floats."""
    try:
        values = tuple(check_number(w, "weights", 0) for w in weights)
    except TypeError:
        values = ()
    if len(values) != len(ops) or sum(v > 0 for v in values) < max(num_layers, 1):
        raise ValueError(f"`weights` must be one number >= 0 per op ({len(ops)}), at least "
                         f"num_layers ({num_layers}) of them > 0 (timm draws distinct ops). "
                         f"Found: {shorten(weights)}.")
    return values


def pil_interp(value: Any) -> str:
    """A PIL resampling filter (enum or int) as "nearest", "bilinear" or "bicubic"."""
    names = {0: "nearest", 2: "bilinear", 3: "bicubic"}
    key = int(getattr(value, "value", value)) if value is not None else 3
    if key not in names:
        raise ValueError(f"timm interpolation {shorten(value)} is not on the fast path "
                         "(nearest, bilinear, bicubic are).")
    return names[key]
