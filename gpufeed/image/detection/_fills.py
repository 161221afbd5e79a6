"""torchvision v2's ``fill`` argument, resolved per type of input as its ``_setup_fill_arg`` /
``_get_fill`` / ``_convert_fill_arg`` do, with types matched by class NAME (so that a dict keyed
by ``tv_tensors.Image`` / ``tv_tensors.Mask`` works, and ops pickle without torchvision).

The names: ``"Image"`` (a ``tv_tensors.Image``; also what gpufeed's joint ops use for the
sample's image), ``"Tensor"`` (a plain tensor image), ``"Mask"``; any other type takes the
``"others"`` entry. torchvision tests ``type in fill``: a ``defaultdict``'s default is never
used, only its real ``"others"`` entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpufeed.errors import shorten

__all__ = ["Fill", "check_fill", "fill_for", "fill_value", "setup_fill", "type_name"]

#: a resolved fill: None (0, or torchvision's default), a number, or one float per channel
Fill = float | tuple[float, ...] | None


def type_name(key: Any) -> str:
    """A fill dict's (or ``ToDtype`` dict's) key as a name: a string as is, a type by its
    ``__name__``."""
    return key if isinstance(key, str) else getattr(key, "__name__", str(key))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def fill_value(value: Any) -> Fill:
    """One fill as torchvision's ``_convert_fill_arg`` gives it: None, a number, or a tuple of
    floats. Anything else: TypeError."""
    if value is None:
        return None
    if _is_number(value):
        return value if isinstance(value, (int, float)) else float(value)
    if isinstance(value, (tuple, list)) and len(value) > 0 and all(_is_number(v) for v in value):
        return tuple(float(v) for v in value)
    raise TypeError(f"`fill` must be None, a number, a sequence of numbers or a dict of them. "
                    f"Found: {shorten(value)}.")


def setup_fill(fill: Any) -> dict[str, Fill]:
    """``fill`` (a value, or a dict keyed by types, their names or ``"others"``) checked and as
    a dict keyed by type NAME (torchvision's ``_setup_fill_arg``: a value is ``"others"``)."""
    if isinstance(fill, Mapping):
        return {type_name(k): fill_value(v) for k, v in fill.items()}
    return {"others": fill_value(fill)}


def fill_for(fill: Any, name: str) -> Fill:
    """The fill of an input of type name ``name`` (``"Image"``, ``"Tensor"``, ``"Mask"``, ...)
    from a transform's ``fill`` (as given or from :func:`setup_fill`): a dict's entry whose key
    is that type (or its name), else its ``"others"`` entry, else None; a value that is not a
    dict is the fill of every type. Converted by :func:`fill_value`."""
    if isinstance(fill, Mapping):
        by_name = {type_name(k): v for k, v in fill.items()}  # (items(): no defaultdict default)
        fill = by_name[name] if name in by_name else by_name.get("others")
    return fill_value(fill)


def check_fill(fill: Any) -> Any:
    """A transform's ``fill`` checked as :func:`setup_fill` checks it (TypeError), kept as
    given but for a dict's keys, which become type names (so that the op pickles without
    torchvision)."""
    setup_fill(fill)
    return {type_name(k): v for k, v in fill.items()} if isinstance(fill, Mapping) else fill
