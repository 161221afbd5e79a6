"""torchvision v2's containers of joint ops: ``RandomApply``, ``RandomChoice``, ``RandomOrder``
(and ``Compose`` for a ``Compose`` or ``Identity`` inside one).

Each holds gpufeed joint ops and is one itself. Its ``draw`` draws what torchvision draws
(whether the ops run, which op, in which order) and a seed; ``apply`` runs the chosen ops in
order, each drawing its parameters from a generator of that seed when it runs, on the sample the
op before it left (a ``RandomIoUCrop`` after a ``RandomZoomOut`` sees the zoomed-out boxes, as
in torchvision, whose inner ops draw when they run). The parameters therefore depend on (seed,
epoch, sample index) only, as every joint op's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment._checks import check_p, choice_weights
from gpufeed.image.detection._sample import JointOp, Sample

__all__ = ["Compose", "Container", "RandomApply", "RandomChoice", "RandomOrder"]


def _check_ops(value: Any, empty: bool = False) -> tuple[JointOp, ...]:
    ops = tuple(value) if isinstance(value, Sequence) else None
    if ops is None or (not ops and not empty) or not all(isinstance(op, JointOp) for op in ops):
        raise ValueError(f"`transforms` must be a {'' if empty else 'non-empty '}sequence of gpufeed "
                         f"joint ops. Found: {shorten(value)}.")
    return ops


def _run(ops: Sequence[JointOp], sample: Sample, seed: int) -> Sample:
    rng = np.random.Generator(np.random.PCG64(seed))
    for op in ops:
        sample = op(sample, rng)
    return sample


_PARTLY = "fast, partly "  # a container's ``where`` when only some of its ops run fast


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**63 - 1))


@dataclass(frozen=True)
class Container(JointOp):
    """A container of joint ops (``transforms``); subclasses draw which run, and in what order."""

    transforms: Any = ()

    where = "fast"

    def __post_init__(self) -> None:
        ops = _check_ops(self.transforms, isinstance(self, Compose))
        object.__setattr__(self, "transforms", ops)
        wheres = [getattr(op, "where", "fast") for op in ops]
        given = sorted({w.removeprefix(_PARTLY) for w in wheres} - {"fast"})
        if given:  # nothing inside runs fast: the container neither; some: say so
            fast = any(w.startswith("fast") for w in wheres)
            object.__setattr__(self, "where", _PARTLY + given[0] if fast else given[0])

    def describe(self) -> str:
        """The ops inside, for ``explain``."""
        def one(op: JointOp) -> str:
            if isinstance(op, Compose) and not op.transforms:
                return "Identity"
            inside = f"({op.describe()})" if isinstance(op, Container) else ""
            where = getattr(op, "where", "fast")
            return f"{op.name}{inside}" + ("" if where == "fast" else f" [{where}]")

        return ", ".join(one(op) for op in self.transforms)


@dataclass(frozen=True)
class Compose(Container):
    """The ops of a v2 ``Compose`` inside a container, all of them in order (none: torchvision's
    ``Identity``, e.g. a ``RandomChoice`` between an op and nothing). ``params``: their seed."""

    name = "Compose"

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return _seed(rng) if self.transforms else None

    def apply(self, sample: Sample, params: Any) -> Sample:
        return _run(self.transforms, sample, params)


@dataclass(frozen=True)
class RandomApply(Container):
    """torchvision's ``RandomApply(transforms, p)``: all of ``transforms`` in order with
    probability ``p``. ``params``: None (not applied) or the inner ops' seed."""

    p: float = 0.5
    name = "RandomApply"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "p", check_p(self.p))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return _seed(rng) if rng.random() < self.p else None

    def apply(self, sample: Sample, params: Any) -> Sample:
        return _run(self.transforms, sample, params)


@dataclass(frozen=True)
class RandomChoice(Container):
    """torchvision's ``RandomChoice(transforms, p)``: one of ``transforms``, op i with
    probability ``p[i] / sum(p)`` (None: uniform). ``params``: (index, the op's seed)."""

    p: Any = None
    name = "RandomChoice"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "p", choice_weights(self.p, len(self.transforms)))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        n = len(self.transforms)
        index = int(rng.integers(n)) if self.p is None else int(rng.choice(n, p=self.p))
        return index, _seed(rng)

    def apply(self, sample: Sample, params: Any) -> Sample:
        index, seed = params
        return _run(self.transforms[index:index + 1], sample, seed)


@dataclass(frozen=True)
class RandomOrder(Container):
    """torchvision's ``RandomOrder(transforms)``: all of ``transforms`` in a uniformly random
    order. ``params``: (the order, the ops' seed)."""

    name = "RandomOrder"

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return tuple(int(i) for i in rng.permutation(len(self.transforms))), _seed(rng)

    def apply(self, sample: Sample, params: Any) -> Sample:
        order, seed = params
        return _run([self.transforms[i] for i in order], sample, seed)
