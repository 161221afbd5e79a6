"""AugMix on uint8 rows: torchvision's ``AugMix`` (v1 and v2) and timm's ``AugMixAugment``
(``augment_and_mix_transform("augmix-m5-w4-d2")``).

Both mix ``mixture_width`` chains of random ops with the original row. A chain is 1-3 ops
(``chain_depth`` <= 0) or ``chain_depth`` ops, drawn uniformly with replacement from the op
list, each on the chain's previous output, starting from the original:

- torchvision: weights (m0, m1) ~ Dirichlet(alpha, alpha), chain weights ~
  Dirichlet(alpha, ..., alpha) x m1; the row is m0 x original + sum of weight x chain, in
  float32, truncated back to uint8 (torch's ``.to(torch.uint8)``). An op's magnitude is one of
  the first ``severity`` of 10 bins, signed ops negated with probability 1/2; the ops are
  :func:`~gpufeed.image.augment._policies.apply_op`'s.
- timm: chain weights ~ Dirichlet(alpha, ...), m ~ Beta(alpha, alpha); the chains' weighted sum
  (float32, clipped, truncated) is blended with the original by m as PIL's ``Image.blend``
  does; ``blended=True`` blends each chain in turn with timm's recomputed weights instead. The
  ops are timm's ``AugmentOp`` (probability 1, magnitude uniform in [0, m] unless ``mstd``):
  :func:`~gpufeed.image.augment._timm_rand.draw_timm_op` and
  :func:`~gpufeed.image.augment._timm_rand.apply_timm_op`.

``params`` holds every draw; ``apply`` draws nothing.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._checks import check_fill, check_int, check_interpolation, check_number
from gpufeed.image.augment._policies import _lin, _posterize_bits, apply_op
from gpufeed.image.augment._timm_rand import TIMM_KNOWN, apply_timm_op, check_timm_hparams, draw_timm_op, pil_interp

__all__ = ["TIMM_AUGMIX_OPS", "AugMix", "TimmAugMix", "augmix_space", "pil_blend"]

_PARAMETER_MAX = 10  # torchvision's AugMix: 10 magnitude bins, severity in [1, 10]
_SIGNED = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                     "Color", "Contrast", "Sharpness"})

#: timm's ``_AUGMIX_TRANSFORMS``, in its order
TIMM_AUGMIX_OPS = ("AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                   "SharpnessIncreasing", "Equalize", "Rotate", "PosterizeIncreasing",
                   "SolarizeIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


@functools.lru_cache(maxsize=64)
def augmix_space(all_ops: bool, height: int, width: int) -> tuple[tuple[str, np.ndarray | None], ...]:
    """torchvision's AugMix ``_augmentation_space`` in its order: (op, magnitudes or None)."""
    n = _PARAMETER_MAX
    enhance = _lin(0.0, 0.9, n)
    space: list[tuple[str, np.ndarray | None]] = [
        ("ShearX", _lin(0.0, 0.3, n)), ("ShearY", _lin(0.0, 0.3, n)),
        ("TranslateX", _lin(0.0, width / 3.0, n)), ("TranslateY", _lin(0.0, height / 3.0, n)),
        ("Rotate", _lin(0.0, 30.0, n)), ("Posterize", _posterize_bits(n, 4) - 4),
        ("Solarize", _lin(255.0, 0.0, n)), ("AutoContrast", None), ("Equalize", None)]
    if all_ops:
        space += [("Brightness", enhance), ("Color", enhance), ("Contrast", enhance),
                  ("Sharpness", enhance)]
    return tuple(space)


def pil_blend(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """PIL's ``Image.blend(a, b, alpha)`` on uint8 rows: a + alpha (b - a) in float32, clipped
    and truncated (PIL's C loop)."""
    diff = b.astype(np.int16) - a.astype(np.int16)
    out = a.astype(np.float32) + np.float32(alpha) * diff.astype(np.float32)
    return np.clip(out, 0, 255, out=out).astype(np.uint8)


def _check_mix(op: Any, width: str, depth: str) -> None:
    check_int(getattr(op, width), width, 1)
    value = getattr(op, depth)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{depth}` must be an int (<= 0: a random depth in [1, 3]). "
                         f"Found: {shorten(value)}.")
    alpha = op.alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (
            math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"`alpha` must be a finite number > 0 (the Dirichlet and Beta "
                         f"parameter). Found: {shorten(alpha)}.")
    object.__setattr__(op, "alpha", float(alpha))


def _depth(rng: np.random.Generator, depth: int) -> int:
    return depth if depth > 0 else int(rng.integers(1, 4))


@dataclass(frozen=True)
class AugMix(RowOp):
    """torchvision's ``AugMix(severity, mixture_width, chain_depth, alpha, all_ops,
    interpolation, fill)``: ``mixture_width`` chains of ``chain_depth`` ops (<= 0: 1-3 at
    random), magnitudes from the first ``severity`` (1-10) bins, mixed with the original by
    Dirichlet(``alpha``) weights. ``all_ops=False`` leaves out brightness, color, contrast and
    sharpness."""

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    interpolation: Any = "bilinear"
    fill: Any = None
    name = "AugMix"

    def __post_init__(self) -> None:
        check_int(self.severity, "severity", 1, _PARAMETER_MAX)
        _check_mix(self, "mixture_width", "chain_depth")
        if not isinstance(self.all_ops, bool):
            raise ValueError(f"`all_ops` must be True or False. Found: {shorten(self.all_ops)}.")
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "fill", check_fill(self.fill))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        """(m0, chain weights, chains): each chain ((op, magnitude), ...), as torchvision's
        ``forward`` passes them to ``_apply_op``."""
        m = rng.dirichlet([self.alpha, self.alpha]).astype(np.float32)
        weights = rng.dirichlet([self.alpha] * self.mixture_width).astype(np.float32) * m[1]
        space = augmix_space(self.all_ops, height, width)
        chains = []
        for _ in range(self.mixture_width):
            chain = []
            for _ in range(_depth(rng, self.chain_depth)):
                op, magnitudes = space[int(rng.integers(len(space)))]
                magnitude = 0.0
                if magnitudes is not None:
                    magnitude = float(magnitudes[int(rng.integers(self.severity))])
                    if op in _SIGNED and rng.integers(2):
                        magnitude = -magnitude
                chain.append((op, magnitude))
            chains.append(tuple(chain))
        return float(m[0]), tuple(float(w) for w in weights), tuple(chains)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        m0, weights, chains = params
        mix = np.float32(m0) * row.astype(np.float32)
        for weight, chain in zip(weights, chains):
            aug = row.copy()  # the ops may write in place; every chain starts from the original
            for op, magnitude in chain:
                aug = apply_op(aug, op, magnitude, self.interpolation, self.fill)
            mix += np.float32(weight) * aug.astype(np.float32)
        return np.clip(mix, 0, 255, out=mix).astype(np.uint8)


def _check_timm_ops(value: Any) -> tuple[str, ...]:
    ops = (value,) if isinstance(value, str) else tuple(value)
    unknown = [op for op in ops if op not in TIMM_KNOWN]
    if not ops or unknown:
        raise ValueError(f"`ops` must be timm op names gpufeed has ({sorted(TIMM_KNOWN)}). "
                         f"Found: {shorten(value)}.")
    return ops


def _parse_config(config: Any) -> dict[str, Any]:
    """timm's ``augment_and_mix_transform`` sections: m, w, d, a, b, mstd."""
    parts = config.split("-") if isinstance(config, str) else []
    if not parts or parts[0] != "augmix":
        raise ValueError(f"a timm AugMix config starts with 'augmix' (e.g. 'augmix-m5-w4-d2'). "
                         f"Found: {shorten(config)}.")
    out: dict[str, Any] = {}
    keys: dict[str, tuple[str, Callable[[str], Any]]] = {
        "m": ("magnitude", int), "w": ("width", int), "d": ("depth", int),
        "a": ("alpha", float), "b": ("blended", lambda v: bool(int(v))),
        "mstd": ("magnitude_std", float)}
    for part in parts[1:]:
        pieces = re.split(r"(\d.*)", part)
        if len(pieces) < 2:
            continue
        key, value = pieces[:2]
        if key not in keys:
            raise ValueError(f"cannot read timm AugMix config {shorten(config)} at {part!r}: "
                             f"unknown section {key!r}. Sections: m, w, d, a, b, mstd.")
        field, kind = keys[key]
        try:
            out[field] = kind(value)
        except ValueError:
            raise ValueError(f"cannot read timm AugMix config {shorten(config)} at {part!r}: "
                             f"{key} takes a number.") from None
    return out


@dataclass(frozen=True)
class TimmAugMix(RowOp):
    """timm's ``AugMixAugment``: build it from a config string with :meth:`from_config`
    (``"augmix-m5-w4-d2"``) or from timm's object with :meth:`from_timm`. ``width`` chains of
    ``depth`` ops (<= 0: 1-3 at random) from ``ops`` at ``magnitude`` (0-10; uniform in [0, m]
    with the default ``magnitude_std`` inf), Dirichlet/Beta(``alpha``) weights; ``blended``:
    timm's blend-per-chain mode. ``fill``, ``interpolation``, ``translate_*``: timm's hparams
    (TimmRandAugment's)."""

    ops: tuple[str, ...] = TIMM_AUGMIX_OPS
    magnitude: float = 3.0
    width: int = 3
    depth: int = -1
    alpha: float = 1.0
    blended: bool = False
    magnitude_std: float = math.inf
    magnitude_max: float | None = None
    translate_pct: float = 0.45
    translate_const: float = 250.0
    fill: Any = (128, 128, 128)
    interpolation: str = "random"
    name = "AugMix(timm)"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _check_timm_ops(self.ops))
        object.__setattr__(self, "magnitude", check_number(self.magnitude, "magnitude", 0))
        _check_mix(self, "width", "depth")
        if not isinstance(self.blended, bool):
            raise ValueError(f"`blended` must be True or False. Found: {shorten(self.blended)}.")
        check_timm_hparams(self)

    @classmethod
    def from_config(cls, config: str, *, fill: Any = (128, 128, 128),
                    interpolation: str = "random", translate_pct: float = 0.45,
                    translate_const: float = 250.0) -> TimmAugMix:
        """timm's ``augment_and_mix_transform(config, hparams)``: sections ``m`` (severity,
        default 3), ``w`` (chains, 3), ``d`` (depth, -1: 1-3), ``a`` (alpha, 1), ``b`` (blended,
        0), ``mstd`` (magnitude noise; default: uniform in [0, m]). timm's ``create_transform``
        passes ``translate_pct=0.3``."""
        return cls(**_parse_config(config), fill=fill, interpolation=interpolation,
                   translate_pct=translate_pct, translate_const=translate_const)

    @classmethod
    def from_timm(cls, transform: Any) -> TimmAugMix:
        """The same op as timm's ``AugMixAugment`` object ``transform`` (its ops, their hparams,
        alpha, width, depth and blended mode are read; timm is not imported). Ops with
        different settings, or ops gpufeed does not have: ValueError."""
        ops = list(transform.ops)
        if not ops:
            raise ValueError("timm's AugMixAugment has no ops.")
        first = ops[0]
        settings = {(op.prob, op.magnitude, op.magnitude_std, op.magnitude_max,
                     tuple(sorted(op.hparams.items())), repr(op.kwargs)) for op in ops}
        if len(settings) != 1 or float(first.prob) != 1.0:
            raise ValueError("timm AugMix ops with different settings or a probability other "
                             "than 1 are not on the fast path.")
        hp = dict(first.hparams)
        resample = first.kwargs.get("resample")
        interp = "random" if isinstance(resample, (tuple, list)) else pil_interp(resample)
        return cls(ops=tuple(op.name for op in ops), magnitude=float(first.magnitude),
                   width=int(transform.width), depth=int(transform.depth),
                   alpha=float(transform.alpha), blended=bool(transform.blended),
                   magnitude_std=float(first.magnitude_std), magnitude_max=first.magnitude_max,
                   translate_pct=float(hp.get("translate_pct", 0.45)),
                   translate_const=float(hp.get("translate_const", 250)),
                   fill=first.kwargs.get("fillcolor", (128, 128, 128)), interpolation=interp)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        """(chain weights, m, chains): each chain ((op name, level args, interpolation), ...)."""
        weights = rng.dirichlet([self.alpha] * self.width).astype(np.float32)
        m = np.float32(rng.beta(self.alpha, self.alpha))
        chains = []
        for _ in range(self.width):
            chosen = rng.integers(len(self.ops), size=_depth(rng, self.depth))
            drawn = (draw_timm_op(rng, self.ops[int(k)], 1.0, self.magnitude, self.magnitude_std,
                                  self.magnitude_max, self.interpolation, self.translate_pct,
                                  self.translate_const) for k in chosen)
            chains.append(tuple(d for d in drawn if d is not None))
        return tuple(float(w) for w in weights), float(m), tuple(chains)

    def _chain(self, row: np.ndarray, chain: Any) -> np.ndarray:
        aug = row.copy()  # the ops may write in place; every chain starts from the original
        for name, args, interp in chain:
            aug = apply_timm_op(aug, name, args, interp, self.fill)
        return aug

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        weights, m, chains = params
        if self.blended:
            out = row
            for w, chain in zip(_blended_weights(weights, m), chains):
                out = pil_blend(out, self._chain(row, chain), float(w))
            return out
        mixed = np.zeros(row.shape, np.float32)
        for w, chain in zip(weights, chains):
            mixed += np.float32(w) * self._chain(row, chain).astype(np.float32)
        np.clip(mixed, 0, 255, out=mixed)
        return pil_blend(row, mixed.astype(np.uint8), m)


def _blended_weights(weights: Any, m: float) -> np.ndarray:
    """timm's ``_calc_blended_weights``: the chain weights x m, made into the alphas of one
    ``Image.blend`` per chain (last chain first), so the chains end with their mixing weights."""
    ws = np.asarray(weights, np.float32) * np.float32(m)
    cump = np.float32(1.0)
    alphas = []
    for w in ws[::-1]:
        alpha = w / cump
        cump = cump * (np.float32(1.0) - alpha)
        alphas.append(alpha)
    return np.array(alphas[::-1], dtype=np.float32)
