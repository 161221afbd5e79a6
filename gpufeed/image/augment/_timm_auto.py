"""timm's AutoAugment (``auto_augment_transform("original-mstd0.5")`` and its other policies) on
uint8 rows.

timm's ``AutoAugment`` picks one sub-policy uniformly and runs its ops in order, each an
``AugmentOp(name, probability, magnitude)``: the draws of one op (whether it applies, the
magnitude noise, the sign, the warp's interpolation) and its pixels are timm RandAugment's
(:func:`~gpufeed.image.augment._timm_rand.draw_timm_op`,
:func:`~gpufeed.image.augment._timm_rand.apply_timm_op`); only the choice differs. ``params`` is
((op name, level args, interpolation), ...), the ops of the chosen sub-policy that apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._checks import check_number
from gpufeed.image.augment._timm_rand import TIMM_KNOWN, apply_timm_op, check_timm_hparams, draw_timm_op, pil_interp

__all__ = ["TIMM_AUTO_POLICIES", "TimmAutoAugment"]

SubPolicy = tuple[tuple[str, float, float], ...]

# The ImageNet policy of the AutoAugment paper, as timm's "original" writes it: (op, prob, m).
_ORIGINAL: tuple[SubPolicy, ...] = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)),
    (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)),
    (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)
# timm's "v0": the ImageNet policy of the TPU EfficientNet code.
_V0: tuple[SubPolicy, ...] = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)),
    (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)),
    (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)),
    (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)),
    (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)),
    (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)),
    (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)),
    (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)),
    (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)),
    (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)),
    (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)),
    (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)),
    (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)


def _with_posterize(policy: tuple[SubPolicy, ...], old: str) -> tuple[SubPolicy, ...]:
    """The "r" variant of a policy: the research code's posterize (bits dropped grow with m)."""
    return tuple(tuple(("PosterizeIncreasing" if op == old else op, p, m) for op, p, m in sub)
                 for sub in policy)


# timm's "3a": DeiT III's three augmentations, one of them per image (solarize at threshold 128,
# grey, a PIL Gaussian blur of radius uniform in [0.1, 2]).
_3A: tuple[SubPolicy, ...] = (
    (("Solarize", 1.0, 5),),
    (("Desaturate", 1.0, 10),),
    (("GaussianBlurRand", 1.0, 10),),
)

#: timm's AutoAugment policies by name
TIMM_AUTO_POLICIES: dict[str, tuple[SubPolicy, ...]] = {
    "original": _ORIGINAL,
    "originalr": _with_posterize(_ORIGINAL, "PosterizeOriginal"),
    "v0": _V0,
    "v0r": _with_posterize(_V0, "Posterize"),
    "3a": _3A,
}


def _check_policy(policy: Any) -> tuple[SubPolicy, ...]:
    if isinstance(policy, str):
        if policy not in TIMM_AUTO_POLICIES:
            raise ValueError(f"`policy` must be one of {sorted(TIMM_AUTO_POLICIES)} or "
                             f"sub-policies of (op, prob, magnitude). Found: {shorten(policy)}.")
        return TIMM_AUTO_POLICIES[policy]
    try:
        subs = tuple(tuple((str(op), float(p), float(m)) for op, p, m in sub) for sub in policy)
    except (TypeError, ValueError):
        subs = ()
    if not subs or not all(subs):
        raise ValueError(f"`policy` must be a policy name or non-empty sub-policies of "
                         f"(op name, probability, magnitude). Found: {shorten(policy)}.")
    for sub in subs:
        for op, p, m in sub:
            if op not in TIMM_KNOWN:
                raise ValueError(f"`policy` holds {op!r}, which is not a timm op gpufeed has "
                                 f"({sorted(TIMM_KNOWN)}). Found: {shorten(policy)}.")
            check_number(p, "probability", 0, 1)
            check_number(m, "magnitude", 0)
    return subs


@dataclass(frozen=True)
class TimmAutoAugment(RowOp):
    """timm's ``AutoAugment``: build it from a config string with :meth:`from_config`
    (``"original-mstd0.5"``) or from timm's object with :meth:`from_timm`. ``policy``: a name of
    :data:`TIMM_AUTO_POLICIES` or sub-policies of (op, probability, magnitude 0-10); ``fill``,
    ``interpolation``, ``translate_*``, ``magnitude_*``: timm's hparams (TimmRandAugment's)."""

    policy: Any = "v0"
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    translate_pct: float = 0.45
    translate_const: float = 250.0
    fill: Any = (128, 128, 128)
    interpolation: str = "random"
    name = "AutoAugment(timm)"

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", _check_policy(self.policy))
        check_timm_hparams(self)

    @classmethod
    def from_config(cls, config: str, *, fill: Any = (128, 128, 128),
                    interpolation: str = "random", translate_pct: float = 0.45,
                    translate_const: float = 250.0) -> TimmAutoAugment:
        """timm's ``auto_augment_transform(config, hparams)``: a policy name, then an optional
        ``mstd`` section (magnitude noise), e.g. ``"original-mstd0.5"``."""
        parts = config.split("-") if isinstance(config, str) else []
        if not parts or parts[0] not in TIMM_AUTO_POLICIES:
            raise ValueError(f"a timm AutoAugment config starts with a policy name "
                             f"({sorted(TIMM_AUTO_POLICIES)}), e.g. 'original-mstd0.5'. "
                             f"Found: {shorten(config)}.")
        std = 0.0
        for part in parts[1:]:
            pieces = re.split(r"(\d.*)", part)
            if len(pieces) < 2:
                continue
            key, value = pieces[:2]
            if key != "mstd":
                raise ValueError(f"cannot read timm AutoAugment config {shorten(config)} at "
                                 f"{part!r}: the only section is mstd.")
            try:
                std = float(value)
            except ValueError:
                raise ValueError(f"cannot read timm AutoAugment config {shorten(config)} at "
                                 f"{part!r}: mstd takes a number.") from None
        return cls(policy=parts[0], magnitude_std=std, translate_pct=translate_pct,
                   translate_const=translate_const, fill=fill, interpolation=interpolation)

    @classmethod
    def from_timm(cls, transform: Any) -> TimmAutoAugment:
        """The same op as timm's ``AutoAugment`` object ``transform`` (its sub-policies and
        their ops' hparams are read; timm is not imported). Ops with different hparams, or ops
        gpufeed does not have: ValueError."""
        subs = [list(sub) for sub in transform.policy]
        ops = [op for sub in subs for op in sub]
        if not ops:
            raise ValueError("timm's AutoAugment has no ops.")
        first = ops[0]
        settings = {(op.magnitude_std, op.magnitude_max, tuple(sorted(op.hparams.items())),
                     repr(op.kwargs)) for op in ops}
        if len(settings) != 1:
            raise ValueError("timm AutoAugment ops with different hparams are not on the fast path.")
        hp = dict(first.hparams)
        resample = first.kwargs.get("resample")
        interp = "random" if isinstance(resample, (tuple, list)) else pil_interp(resample)
        return cls(policy=tuple(tuple((op.name, float(op.prob), float(op.magnitude)) for op in sub)
                                for sub in subs),
                   magnitude_std=float(first.magnitude_std), magnitude_max=first.magnitude_max,
                   translate_pct=float(hp.get("translate_pct", 0.45)),
                   translate_const=float(hp.get("translate_const", 250)),
                   fill=first.kwargs.get("fillcolor", (128, 128, 128)), interpolation=interp)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        sub = self.policy[int(rng.integers(len(self.policy)))]
        drawn = (draw_timm_op(rng, name, p, m, self.magnitude_std, self.magnitude_max,
                              self.interpolation, self.translate_pct, self.translate_const)
                 for name, p, m in sub)
        return tuple(d for d in drawn if d is not None)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        for name, args, interp in params:
            row = apply_timm_op(row, name, args, interp, self.fill)
        return row
