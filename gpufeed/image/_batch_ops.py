"""Batch ops: MixUp and CutMix over a whole image batch, in the workers (docs/design/sample-model.md,
section 5).

``FastLoader(batch_transform=...)`` takes torchvision v2's ``MixUp``, ``CutMix`` and
``RandomChoice`` of them, or timm's ``Mixup`` (``mode="batch"``); :func:`batch_op_from` reads the
original's settings (recognised by class module, name and attributes: neither library is
imported) into a :class:`BatchOp`, which draws the batch's parameters (:meth:`BatchOp.draw`: which
op, lambda, the box) from a generator keyed by (seed, epoch, batch number) (:func:`batch_rng`) and
applies them with gpufeed's arithmetic:

- **pairing** as each original pairs: torchvision's ``roll(1)`` (row i with row i-1, row 0 with
  the last), timm's ``flip(0)`` (row i with row n-1-i), over the kept rows (a skipped sample is
  left out before pairing);
- **CutMix** pastes the partner's box into each row, on the uint8 rows before the dtype pass (the
  normalize is per pixel, so pasting before or after it gives the same numbers);
- **MixUp** is folded into the dtype/normalize pass (:func:`convert_mixed_`): each uint8 row is
  converted once and blended with its partner's converted row while both are in the cache,
  instead of a second pass over the float batch;
- **targets** become float32 ``[n, num_classes]``: ``lam * onehot(y) + (1 - lam) * onehot(y_partner)``,
  with timm's label smoothing (``off = smoothing / C``, ``on = 1 - smoothing + off``).

MixUp needs a float output: torchvision's ``MixUp`` refuses uint8 batches (its in-place float
multiply cannot be cast back to uint8), and a uint8 blend would round every pixel, so a loader
with a MixUp and ``dtype=torch.uint8`` is refused at construction. CutMix alone works on uint8.
With ``device="cuda"`` the worker only draws the parameters; :meth:`BatchOp.mix_` and
:meth:`BatchOp.soft_targets` run on the GPU after the normalize, on whole-batch tensors, with no
host synchronisation (``gpufeed.cuda._transform``).
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpufeed.errors import shorten
from gpufeed.image._normalize import convert_, memory_rows, work_dtype

MIXUP, CUTMIX = "mixup", "cutmix"
PAIRINGS = ("roll", "flip")
_TV = "torchvision.transforms"
_TIMM = "timm.data"
ACCEPTED = ("torchvision.transforms.v2.MixUp, CutMix or RandomChoice of them, or timm.data.Mixup "
            "(mode='batch')")


def batch_rng(seed: int, epoch: int, batch: int) -> np.random.Generator:
    """A generator that depends only on (seed, epoch, batch number in the pass): SHAKE-128 of the
    three, under a key of its own, seeds a PCG64 (as ``augment.row_rng`` does for rows)."""
    key = f"gpufeed-batch-op:{int(seed)}:{int(epoch)}:{int(batch)}".encode()
    words = struct.unpack("<4I", hashlib.shake_128(key).digest(16))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(words))))


@dataclass(frozen=True)
class Mix:
    """One mixing op as its original draws it: ``kind`` (MixUp or CutMix), lambda ~ Beta(alpha,
    alpha), and for CutMix how the box is placed: ``box="torchvision"`` (a centre drawn in the
    image, half-sides ``int(0.5 * sqrt(1 - lam) * size)``), ``"timm"`` (``rand_bbox``), or timm's
    ``minmax`` (side ratios drawn in [min, max)); ``correct_lam``: lambda becomes the box's
    complement share of the image (torchvision always; timm's ``correct_lam``)."""

    kind: str
    alpha: float
    box: str = "torchvision"
    minmax: tuple[float, float] | None = None
    correct_lam: bool = True


@dataclass(frozen=True)
class MixParams:
    """One batch's draw: ``kind`` None when the batch is not mixed (timm's ``prob``), ``lam`` the
    weight of each row's own image and label, ``box`` CutMix's ``(y1, y2, x1, x2)``. Small and
    picklable: with ``device="cuda"`` it travels with the host batch to the GPU."""

    kind: str | None
    lam: float = 1.0
    box: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class BatchOp:
    """A batch op gpufeed runs (made by :func:`batch_op_from`): ``mixes`` chosen with ``weights``
    when the batch is mixed at all (probability ``prob``), ``pairing`` ``"roll"`` or ``"flip"``,
    soft targets over ``num_classes`` with ``label_smoothing``; ``name``: the original's text."""

    mixes: tuple[Mix, ...]
    weights: tuple[float, ...]
    num_classes: int
    prob: float = 1.0
    label_smoothing: float = 0.0
    pairing: str = "roll"
    name: str = ""

    def __post_init__(self) -> None:
        if self.pairing not in PAIRINGS:
            raise ValueError(f"`pairing` must be one of {PAIRINGS}. Found: {shorten(self.pairing)}.")
        if len(self.mixes) != len(self.weights) or not self.mixes:
            raise ValueError(f"a BatchOp needs one weight per mix. Found: {len(self.mixes)} mixes, "
                             f"{len(self.weights)} weights.")

    @property
    def mixes_pixels(self) -> bool:
        """Some draw blends pixels (MixUp), which needs a float output."""
        return any(m.kind == MIXUP for m in self.mixes)

    def draw(self, rng: np.random.Generator, n: int, h: int, w: int) -> MixParams:
        """The parameters of an n-row batch of h x w images."""
        if self.prob < 1.0 and not rng.random() < self.prob:
            return MixParams(None)
        index = 0 if len(self.mixes) == 1 else int(rng.choice(len(self.mixes), p=self.weights))
        mix = self.mixes[index]
        lam = float(rng.beta(mix.alpha, mix.alpha))
        if mix.kind == MIXUP:
            return MixParams(MIXUP, lam)
        if mix.minmax is not None:
            box = _minmax_box(rng, mix.minmax, h, w)
        elif mix.box == "timm":
            box = _timm_box(rng, lam, h, w)
        else:
            box = _torchvision_box(rng, lam, h, w)
        if mix.correct_lam or mix.minmax is not None:
            y1, y2, x1, x2 = box
            lam = 1.0 - (y2 - y1) * (x2 - x1) / float(h * w)
        return MixParams(CUTMIX, lam, box)

    def partner(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with its rows in their partners' places (a new tensor): ``roll(1, 0)`` or ``flip(0)``."""
        return x.roll(1, 0) if self.pairing == "roll" else x.flip(0)

    def paste_(self, images: torch.Tensor, params: MixParams) -> torch.Tensor:
        """CutMix's paste into ``images`` (n, C, H, W, any dtype and memory format), in place."""
        if params.kind == CUTMIX and params.box is not None and images.shape[0]:
            y1, y2, x1, x2 = params.box
            region = images[..., y1:y2, x1:x2]
            region.copy_(self.partner(region))
        return images

    def mix_(self, images: torch.Tensor, params: MixParams) -> torch.Tensor:
        """The whole op on a batch already in its output dtype (the GPU's path), in place."""
        if params.kind == CUTMIX:
            return self.paste_(images, params)
        if params.kind == MIXUP and images.shape[0]:
            other = self.partner(images)
            images.mul_(params.lam).add_(other, alpha=1.0 - params.lam)
        return images

    def soft_targets(self, labels: torch.Tensor, params: MixParams, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 ``[n, num_classes]`` targets of int ``labels`` [n] (into ``out`` when given):
        ``lam * y + (1 - lam) * y_partner``, ``y`` the (smoothed) one-hot rows."""
        n, c = labels.shape[0], self.num_classes
        if out is None:
            out = torch.empty((n, c), dtype=torch.float32, device=labels.device)
        off = self.label_smoothing / c
        out.fill_(off).scatter_(1, labels.view(-1, 1).to(torch.int64), 1.0 - self.label_smoothing + off)
        if params.kind is not None and n:
            other = self.partner(out)
            out.mul_(params.lam).add_(other, alpha=1.0 - params.lam)
        return out

    def convert(self, out: torch.Tensor, images: torch.Tensor, constants: Any, params: MixParams) -> torch.Tensor:
        """The batch's dtype pass with this op (CutMix pasted on the uint8 ``images`` first;
        MixUp fused into the pass: :func:`convert_mixed_`)."""
        if params.kind == MIXUP:
            return convert_mixed_(out, images, constants, params.lam, self.pairing)
        self.paste_(images, params)
        return convert_(out, images, constants)

    def describe(self) -> str:
        """One line for ``explain``."""
        parts = []
        for weight, mix in zip(self.weights, self.mixes):
            name = "MixUp" if mix.kind == MIXUP else "CutMix"
            share = "" if len(self.mixes) == 1 else f" p={weight:.3g}"
            parts.append(f"{name}(alpha={mix.alpha:g}{share})")
        prob = "" if self.prob >= 1.0 else f", prob={self.prob:g}"
        smooth = "" if not self.label_smoothing else f", label_smoothing={self.label_smoothing:g}"
        return (f"{' or '.join(parts)}{prob}{smooth}, num_classes={self.num_classes}, "
                f"paired by {self.pairing} (from {self.name})")


def _torchvision_box(rng: np.random.Generator, lam: float, h: int, w: int) -> tuple[int, int, int, int]:
    """torchvision v2 ``CutMix.make_params``'s box, as (y1, y2, x1, x2)."""
    rx, ry = int(rng.integers(w)), int(rng.integers(h))
    r = 0.5 * math.sqrt(1.0 - lam)
    rw, rh = int(r * w), int(r * h)
    return max(ry - rh, 0), min(ry + rh, h), max(rx - rw, 0), min(rx + rw, w)


def _timm_box(rng: np.random.Generator, lam: float, h: int, w: int) -> tuple[int, int, int, int]:
    """timm's ``rand_bbox`` (no margin), as (y1, y2, x1, x2)."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
    return (min(max(cy - cut_h // 2, 0), h), min(max(cy + (cut_h + 1) // 2, 0), h),
            min(max(cx - cut_w // 2, 0), w), min(max(cx + (cut_w + 1) // 2, 0), w))


def _minmax_box(rng: np.random.Generator, minmax: tuple[float, float], h: int, w: int) -> tuple[int, int, int, int]:
    """timm's ``rand_bbox_minmax``, as (y1, y2, x1, x2)."""
    cut_h = int(rng.integers(int(h * minmax[0]), int(h * minmax[1])))
    cut_w = int(rng.integers(int(w * minmax[0]), int(w * minmax[1])))
    y1, x1 = int(rng.integers(0, h - cut_h + 1)), int(rng.integers(0, w - cut_w + 1))
    return y1, y1 + cut_h, x1, x1 + cut_w


def convert_mixed_(out: torch.Tensor, images: torch.Tensor, constants: Any, lam: float, pairing: str) -> torch.Tensor:
    """``convert_(out, images, constants)`` followed by MixUp (``lam * x + (1 - lam) * x_partner``),
    in one pass on CPU: each uint8 row is converted once into a scratch row and written blended
    with its partner's converted row (roll: the row converted the step before, the last row
    converted first for row 0; flip: rows i and n-1-i together). Other devices and strides: the
    two passes. Returns ``out``."""
    views = memory_rows(out, images, constants) if out.device.type == "cpu" else None
    if views is None:
        convert_(out, images, constants)
        other = out.roll(1, 0) if pairing == "roll" else out.flip(0)
        return out.mul_(lam).add_(other, alpha=1.0 - lam)
    src, dst, scale, shift = views
    n = src.shape[0]
    if n == 0:
        return out
    work = work_dtype(out.dtype)
    rows = [torch.empty(src.shape[1:], dtype=work) for _ in range(3)]
    blend = None if out.dtype == work else torch.empty(src.shape[1:], dtype=work)

    def convert_row(i: int, row: torch.Tensor) -> torch.Tensor:
        row.copy_(src[i])
        if scale is None or shift is None:
            return row.mul_(1.0 / 255.0)
        return row.mul_(scale).add_(shift)

    def write(i: int, own: torch.Tensor, other: torch.Tensor) -> None:
        target = dst[i] if blend is None else blend
        torch.lerp(other, own, lam, out=target)  # other + lam * (own - other): one pass
        if blend is not None:
            dst[i].copy_(blend)

    if pairing == "flip":
        for i in range((n + 1) // 2):
            a, b = convert_row(i, rows[0]), convert_row(n - 1 - i, rows[1])
            write(i, a, b)
            if n - 1 - i != i:
                write(n - 1 - i, b, a)
        return out
    last = convert_row(n - 1, rows[0])
    prev, cur = last, rows[1]
    for i in range(n):
        own = last if i == n - 1 else convert_row(i, cur)
        write(i, own, prev)
        if i < n - 1:
            prev, cur = own, (rows[2] if own is rows[1] else rows[1])
    return out


def batch_op_from(obj: Any) -> BatchOp:
    """The gpufeed batch op of ``obj`` (a torchvision or timm op, recognised without importing
    either), or ``TypeError``/``ValueError`` naming what is accepted and the fix."""
    cls = type(obj)
    module, name = cls.__module__, cls.__name__
    text = f"{module}.{name}"
    if module.startswith(_TV) and name in ("MixUp", "CutMix"):
        mix = _torchvision_mix(obj, name)
        return BatchOp((mix,), (1.0,), _num_classes(obj, text), name=f"torchvision {name}")
    if module.startswith(_TV) and name == "RandomChoice":
        return _random_choice(obj)
    if module.startswith(_TIMM) and name == "Mixup":
        return _timm_mixup(obj)
    raise TypeError(
        f"`batch_transform` must be {ACCEPTED}. Found: {shorten(obj)} ({text}). gpufeed runs "
        "these in its workers with its own arithmetic; apply any other batch transform in your "
        "training step, on the batches the loader gives.")


def _num_classes(obj: Any, text: str) -> int:
    n = getattr(obj, "num_classes", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"`batch_transform` {text} needs `num_classes` (an int >= 1): the loader's labels are "
            f"class indices, made into soft targets [N, num_classes]. Found: {shorten(n)}.")
    return n


def _torchvision_mix(obj: Any, name: str) -> Mix:
    alpha = float(obj.alpha)
    if not alpha > 0:
        raise ValueError(f"`batch_transform` torchvision {name} needs `alpha` > 0. Found: {alpha}.")
    return Mix(MIXUP if name == "MixUp" else CUTMIX, alpha)


def _random_choice(obj: Any) -> BatchOp:
    members = list(getattr(obj, "transforms", ()))
    bad = [m for m in members if not (type(m).__module__.startswith(_TV) and type(m).__name__ in ("MixUp", "CutMix"))]
    if bad or not members:
        raise TypeError(
            f"`batch_transform` RandomChoice must hold torchvision v2 MixUp or CutMix only. "
            f"Found: {', '.join(type(m).__name__ for m in bad) or 'no transforms'}.")
    classes = {_num_classes(m, type(m).__name__) for m in members}
    if len(classes) != 1:
        raise ValueError(f"`batch_transform` RandomChoice: its ops disagree on `num_classes`. "
                         f"Found: {sorted(classes)}.")
    p = [float(v) for v in getattr(obj, "p", None) or [1.0] * len(members)]
    total = sum(p)
    mixes = tuple(_torchvision_mix(m, type(m).__name__) for m in members)
    return BatchOp(mixes, tuple(v / total for v in p), classes.pop(), name="torchvision RandomChoice")


def _timm_mixup(obj: Any) -> BatchOp:
    mode = getattr(obj, "mode", "batch")
    if mode != "batch":
        raise ValueError(
            f"`batch_transform` timm Mixup with mode={mode!r} draws one lambda per sample "
            "('elem') or pair ('pair'); gpufeed runs mode='batch' only (one draw per batch). Use "
            "mode='batch', or apply this Mixup in your training step.")
    if getattr(obj, "multi_label", False):
        raise ValueError("`batch_transform` timm Mixup with multi_label=True mixes dense targets; "
                         "gpufeed's labels are class indices. Apply it in your training step.")
    if not getattr(obj, "mixup_enabled", True):
        raise ValueError("`batch_transform` timm Mixup has mixup_enabled=False. Leave batch_transform "
                         "unset for unmixed batches (loader.replace(batch_transform=None)).")
    mixup_alpha, cutmix_alpha = float(obj.mixup_alpha), float(obj.cutmix_alpha)
    minmax = getattr(obj, "cutmix_minmax", None)
    minmax = None if minmax is None else (float(minmax[0]), float(minmax[1]))
    correct = bool(getattr(obj, "correct_lam", True))
    cutmix = Mix(CUTMIX, cutmix_alpha, "timm", minmax, correct)
    switch = float(obj.switch_prob)
    mixes: tuple[Mix, ...]
    weights: tuple[float, ...]
    if mixup_alpha > 0 and cutmix_alpha > 0:
        mixes, weights = (Mix(MIXUP, mixup_alpha), cutmix), (1.0 - switch, switch)
    elif mixup_alpha > 0:
        mixes, weights = (Mix(MIXUP, mixup_alpha),), (1.0,)
    elif cutmix_alpha > 0:
        mixes, weights = (cutmix,), (1.0,)
    else:
        raise ValueError("`batch_transform` timm Mixup needs mixup_alpha > 0, cutmix_alpha > 0 or "
                         "cutmix_minmax. Found: none.")
    return BatchOp(mixes, weights, _num_classes(obj, "timm Mixup"), prob=float(obj.mix_prob),
                   label_smoothing=float(obj.label_smoothing), pairing="flip", name="timm Mixup")
