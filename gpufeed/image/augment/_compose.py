"""torchvision's containers of ops on uint8 rows: ``RandomApply``, ``RandomChoice``, ``RandomOrder``.

Each holds gpufeed :class:`~gpufeed.image.augment._base.RowOp` s and is one itself. Its
``draw`` draws what torchvision draws (whether the ops run, which op, in which order) and then
the parameters of the ops that will run, in the order they run (torchvision's inner ops draw
when they run, so only those draw); ``apply`` runs them with those parameters and draws nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.image.augment._base import RowOp, _check_ops
from gpufeed.image.augment._checks import check_p, choice_weights

__all__ = ["RandomApply", "RandomChoice", "RandomOrder"]


def _check_transforms(value: Any) -> tuple[RowOp, ...]:
    ops = _check_ops(value, RowOp, "transforms")
    if not ops:
        raise ValueError("`transforms` must hold at least one gpufeed RowOp. Found: ().")
    return ops


def _draw_all(ops: tuple[RowOp, ...], rng: np.random.Generator, height: int,
              width: int) -> tuple[Any, ...]:
    return tuple(op.draw(rng, height, width) for op in ops)


@dataclass(frozen=True)
class RandomApply(RowOp):
    """torchvision's ``RandomApply(transforms, p)``: all of ``transforms`` in order with
    probability ``p``. ``params``: None (not applied) or the ops' parameters, in order."""

    transforms: Any = ()
    p: float = 0.5
    name = "RandomApply"

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _check_transforms(self.transforms))
        object.__setattr__(self, "p", check_p(self.p))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        if not rng.random() < self.p:
            return None
        return _draw_all(self.transforms, rng, height, width)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        if params is None:
            return row
        for op, op_params in zip(self.transforms, params, strict=True):
            row = op.apply(row, op_params)
        return row


@dataclass(frozen=True)
class RandomChoice(RowOp):
    """torchvision's ``RandomChoice(transforms, p)``: one of ``transforms``, op i with
    probability ``p[i] / sum(p)`` (None: uniform). ``params``: (index, its parameters)."""

    transforms: Any = ()
    p: Any = None
    name = "RandomChoice"

    def __post_init__(self) -> None:
        ops = _check_transforms(self.transforms)
        object.__setattr__(self, "transforms", ops)
        object.__setattr__(self, "p", choice_weights(self.p, len(ops)))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        n = len(self.transforms)
        index = int(rng.integers(n)) if self.p is None else int(rng.choice(n, p=self.p))
        return index, self.transforms[index].draw(rng, height, width)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        index, op_params = params
        return self.transforms[index].apply(row, op_params)


@dataclass(frozen=True)
class RandomOrder(RowOp):
    """torchvision's ``RandomOrder(transforms)``: all of ``transforms`` in a uniformly random
    order. ``params``: ((index, its parameters), ...) in the order applied."""

    transforms: Any = ()
    name = "RandomOrder"

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _check_transforms(self.transforms))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        order = rng.permutation(len(self.transforms))
        return tuple((int(i), self.transforms[int(i)].draw(rng, height, width)) for i in order)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        for index, op_params in params:
            row = self.transforms[index].apply(row, op_params)
        return row
