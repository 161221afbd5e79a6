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
import struct
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpufeed.errors import shorten

# Components: torch's state bytes; random's, as getstate() or (its words in place, gauss_next);
# numpy's, as get_state() or (its MT19937 words in place, has_gauss, gauss). None: as after set-up.
RngState = tuple[bytes | None, tuple[Any, ...] | None, tuple[Any, ...] | None]

_RANDOM_BYTES = 4 + 624 * 4  # CPython's RandomObject after its header: int index, uint32 state[624]
_MT_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624], int pos
_GAUSS = struct.Struct("=i4xd")  # numpy's aug_bitgen_t after its pointer: int has_gauss, double gauss


def _torch_state() -> bytes:
    return torch.get_rng_state().numpy().tobytes()


def _numpy_state() -> tuple[Any, ...]:
    state: Any = np.random.get_state()  # legacy form: ("MT19937", key, pos, has_gauss, cached_gaussian)
    return tuple(state)


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


def _numpy_reader() -> Callable[[], tuple[bytes, int, float]] | None:
    """A ~1 us read of numpy's global RandomState in place: its MT19937 words and its cached
    gaussian (``get_state()`` takes ~40 us). The gaussian's place in the object is found once by
    setting two probe states (the state is put back) and checked; None where anything differs
    (then ``get_state()`` is used)."""
    rs = getattr(np.random.mtrand, "_rand", None)
    bitgen = getattr(rs, "_bit_generator", None)
    if type(rs) is not np.random.RandomState or type(bitgen) is not np.random.MT19937:
        return None
    words = bitgen.ctypes.state_address
    size = type(rs).__basicsize__
    saved = _numpy_state()
    at = -1
    try:
        for has_gauss, probe in ((1, 1.2345678901234567e-5), (0, -9876.54321098765)):
            np.random.set_state((*saved[:3], has_gauss, probe))
            raw = ctypes.string_at(id(rs), size)
            if at < 0:
                at = raw.find(struct.pack("=d", probe)) - 8
                if at < 0:
                    return None
            if _GAUSS.unpack_from(raw, at) != (has_gauss, probe):
                return None
    finally:
        np.random.set_state(saved)
    gauss = id(rs) + at

    def read() -> tuple[bytes, int, float]:
        return (ctypes.string_at(words, _MT_BYTES), *_GAUSS.unpack(ctypes.string_at(gauss, _GAUSS.size)))

    return read


def _as_getstate(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """A random component as ``random.getstate()`` gives it (from the in-place form, too)."""
    if len(part) != 2:
        return part
    raw, gauss_next = part
    index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    return (3, (*np.frombuffer(raw, dtype=np.uint32, offset=4).tolist(), index), gauss_next)


def _as_get_state(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """A numpy component as ``numpy.random.get_state()`` gives it (from the in-place form, too)."""
    if len(part) != 3:
        return part
    raw, has_gauss, gauss = part
    key = np.frombuffer(raw, dtype=np.uint32, count=624).copy()
    return ("MT19937", key, int.from_bytes(raw[-4:], sys.byteorder, signed=True), has_gauss, gauss)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if len(a) != 5 or len(b) != 5:  # not numpy's get_state() form (arrays do not compare as ==)
        return a == b
    return a[2:] == b[2:] and a[0] == b[0] and np.array_equal(a[1], b[1])


class RngTracker:
    """Worker side: what changed since the last send, and restoring a sent state."""

    def __init__(self) -> None:
        # After set-up: the states None stands for.
        self._base: tuple[bytes, tuple[Any, ...], tuple[Any, ...]] = (
            _torch_state(), random.getstate(), _numpy_state())
        self._sent: list[Any] = [None, None, None]  # the last state sent (or restored)
        self._random_read = _random_reader()
        self._numpy_read = _numpy_reader()
        self._now: list[Any] = self._read()  # each generator's state as last compared

    def _read(self) -> list[Any]:
        """The three states now, in the cheapest form at hand."""
        if self._random_read is None:
            r: tuple[Any, ...] = random.getstate()
        else:
            r = (self._random_read(), random._inst.gauss_next)  # type: ignore[attr-defined]
        n = _numpy_state() if self._numpy_read is None else self._numpy_read()
        return [_torch_state(), r, n]

    def changes(self) -> RngState | None:
        """The state now if any generator moved since the last send, else None."""
        changed = False
        for i, part in enumerate(self._read()):
            if not _same(part, self._now[i]):
                self._now[i] = self._sent[i] = part
                changed = True
        return (self._sent[0], self._sent[1], self._sent[2]) if changed else None

    def restore(self, state: RngState) -> None:
        """Set the generators to ``state`` (None components: as after set-up)."""
        t, r, n = (base if part is None else part for part, base in zip(state, self._base))
        torch.set_rng_state(torch.frombuffer(bytearray(t), dtype=torch.uint8))
        random.setstate(_as_getstate(r))  # type: ignore[arg-type]
        np.random.set_state(_as_get_state(n))  # type: ignore[arg-type]
        self._now = self._read()
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
        _, key, pos, has_gauss, cached = _as_get_state(n)
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
