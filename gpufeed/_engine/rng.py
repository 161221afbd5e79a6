"""A worker's global random states, for exact mid-epoch resume (docs/design/resume.md).

The three generators torch seeds in every DataLoader worker: torch's default CPU generator,
``random`` and numpy's legacy global ``RandomState``. A worker captures them after each task and
sends them with its reply only when one changed since its last send (``RngTracker.changes``),
so a dataset that never draws pays a few microseconds per batch and sends nothing. A state is a
tuple ``(torch, random, numpy)`` (``RngState``) whose ``None`` components are as the worker's
set-up left them (seeds from the pass's base seed, then ``worker_init_fn``).

``encode``/``decode`` turn one into the JSON form of ``FastLoader.state_dict()`` (base64).
"""

from __future__ import annotations

import base64
import ctypes
import functools
import random
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpufeed.errors import shorten

# torch state bytes, random's (getstate(), or (its words in place, gauss_next)),
# numpy.random.get_state(); None: as after set-up.
RngState = tuple[bytes | None, tuple[Any, ...] | None, tuple[Any, ...] | None]

_MT_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624], int pos
_RANDOM_BYTES = 4 + 624 * 4  # CPython's RandomObject after its header: int index, uint32 state[624]


def _torch_state() -> bytes:
    return torch.get_rng_state().numpy().tobytes()


def _numpy_state() -> tuple[Any, ...]:
    state: Any = np.random.get_state()  # legacy form: ("MT19937", key, pos, has_gauss, cached_gaussian)
    return tuple(state)


def _numpy_raw() -> bytes | None:
    """The raw MT19937 words of numpy's global RandomState (a 0.4 us read; ``get_state()``
    takes ~40 us), or None where the private handle is not there (then get_state is used)."""
    try:
        bitgen = np.random.mtrand._rand._bit_generator
        if type(bitgen).__name__ != "MT19937":
            return None
        return ctypes.string_at(bitgen.ctypes.state_address, _MT_BYTES)
    except (AttributeError, TypeError, ValueError):
        return None


def _random_reader() -> Callable[[], bytes] | None:
    """A 0.5 us read of the MT words of ``random``'s global generator in place (``getstate()``
    builds a 625-int tuple: ~10 us, and comparing two ~5 us more), checked once against
    ``getstate()``; None where the layout is another (then ``getstate()`` is used)."""
    inst = getattr(random, "_inst", None)
    if type(inst) is not random.Random:
        return None
    address = id(inst) + object.__basicsize__
    raw = ctypes.string_at(address, _RANDOM_BYTES)
    index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    if (*np.frombuffer(raw, dtype=np.uint32, offset=4).tolist(), index) != tuple(inst.getstate()[1]):
        return None
    return functools.partial(ctypes.string_at, address, _RANDOM_BYTES)


def _as_getstate(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """A random component as ``random.getstate()`` gives it (from the in-place form, too)."""
    if len(part) != 2:
        return part
    raw, gauss_next = part
    index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    return (3, (*np.frombuffer(raw, dtype=np.uint32, offset=4).tolist(), index), gauss_next)


def _numpy_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[2:] == b[2:] and a[0] == b[0] and np.array_equal(a[1], b[1])


class RngTracker:
    """Worker side: what changed since the last send, and restoring a sent state."""

    def __init__(self) -> None:
        # After set-up: the states None stands for.
        self._base: tuple[bytes, tuple[Any, ...], tuple[Any, ...]] = (
            _torch_state(), random.getstate(), _numpy_state())
        self._sent: list[Any] = [None, None, None]  # the last state sent (or restored)
        self._torch, _, self._numpy = self._base
        self._numpy_raw = _numpy_raw()
        self._random_read = _random_reader()
        self._random_raw = self._random_now()

    def _random_now(self) -> tuple[Any, ...]:
        """``random``'s state: its words in place and its cached gaussian (a 2.5 KB bytes object
        is cheaper to compare, pickle and send than ``getstate()``'s 625 ints), or (without the
        in-place read) ``getstate()``."""
        if self._random_read is None:
            return random.getstate()
        return self._random_read(), random._inst.gauss_next  # type: ignore[attr-defined]

    def changes(self) -> RngState | None:
        """The state now if any generator moved since the last send, else None."""
        changed = False
        t = _torch_state()
        if t != self._torch:
            self._torch = self._sent[0] = t
            changed = True
        now = self._random_now()
        if now != self._random_raw:
            self._random_raw = self._sent[1] = now
            changed = True
        raw = _numpy_raw()
        # A cached gaussian (has_gauss) can be consumed without moving the MT words.
        if raw is None or raw != self._numpy_raw or self._numpy[3]:
            n = _numpy_state()
            self._numpy_raw = raw
            if not _numpy_same(n, self._numpy):
                self._numpy = self._sent[2] = n
                changed = True
        return (self._sent[0], self._sent[1], self._sent[2]) if changed else None

    def restore(self, state: RngState) -> None:
        """Set the generators to ``state`` (None components: as after set-up)."""
        parts: list[Any] = [base if part is None else part for part, base in zip(state, self._base)]
        t, r, n = parts
        torch.set_rng_state(torch.frombuffer(bytearray(t), dtype=torch.uint8))
        random.setstate(_as_getstate(r))
        np.random.set_state(n)
        self._torch, self._numpy = t, _numpy_state()
        self._numpy_raw = _numpy_raw()
        self._random_raw = self._random_now()
        self._sent = list(state)


# -- JSON form (parent side) ---------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def encode(state: RngState | None) -> dict[str, Any] | None:
    """``state`` as JSON-serialisable data: {"torch": b64 of zlib, "random": [b64, gauss_next],
    "numpy": [b64, pos, has_gauss, cached_gaussian]}, a key only for a generator that moved;
    None when none did."""
    if state is None or all(part is None for part in state):
        return None
    t, r, n = state
    out: dict[str, Any] = {}
    if t is not None:
        out["torch"] = _b64(zlib.compress(t))  # half of its 5056 bytes are zero
    if r is not None:
        version, internal, gauss_next = _as_getstate(r)
        if version != 3:
            raise ValueError(f"random.getstate() version {version!r} is not supported (3 is).")
        out["random"] = [_b64(np.asarray(internal, dtype=np.uint32).tobytes()), gauss_next]
    if n is not None:
        _, key, pos, has_gauss, cached = n
        out["numpy"] = [_b64(np.asarray(key, dtype=np.uint32).tobytes()), int(pos), int(has_gauss), float(cached)]
    return out


def decode(data: dict[str, Any] | None, where: str) -> RngState:
    """The inverse of ``encode``; ``where`` names the state's place for errors."""
    if data is None:
        return (None, None, None)
    if not isinstance(data, dict) or not set(data) <= {"torch", "random", "numpy"}:
        raise ValueError(f"{where} must be null or a dict with keys torch/random/numpy. Found: {shorten(data)}.")
    try:
        t = zlib.decompress(_unb64(data["torch"])) if "torch" in data else None
        r: tuple[Any, ...] | None = None
        if "random" in data:
            words, gauss_next = data["random"]
            internal = tuple(int(x) for x in np.frombuffer(_unb64(words), dtype=np.uint32))
            r = (3, internal, None if gauss_next is None else float(gauss_next))
        n: tuple[Any, ...] | None = None
        if "numpy" in data:
            words, pos, has_gauss, cached = data["numpy"]
            n = ("MT19937", np.frombuffer(_unb64(words), dtype=np.uint32).copy(), int(pos), int(has_gauss),
                 float(cached))
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise ValueError(f"{where} is not a random state written by FastLoader.state_dict(): {exc}.") from exc
    return (t, r, n)
