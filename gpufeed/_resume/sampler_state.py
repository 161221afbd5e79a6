"""Mid-epoch positions of samplers gpufeed does not know: a ``Sampler`` or a
``batch_sampler`` of the user's, resumed in one of two ways (``gpufeed/_resume/indices.py`` keeps the
pass bookkeeping; this module only what is particular to these samplers).

``stateful``  the sampler (or batch sampler) has ``state_dict()`` / ``load_state_dict()``
              (torchdata's ``Stateful`` protocol). As torchdata's ``StatefulDataLoader`` does,
              its position is its own state once the indices of the received batches were drawn
              from it: gpufeed takes ``state_dict()`` after each batch is pulled from it (workers
              pull ahead of the user) and keeps the one at the received position. On resume it
              calls ``load_state_dict()``, then ``iter()``, which must continue from there:
              nothing is skipped (torchdata's ``StatefulDistributedSampler`` and the samplers
              written for ``StatefulDataLoader`` do this). A pass from which nothing was received
              is resumed by iterating the sampler afresh, without loading anything (a sampler
              such as ``StatefulDistributedSampler`` reports its previous pass's position until
              its iterator starts).
``custom``    otherwise the pass's order is redrawn from the random state it started from: the
              state of the sampler's own ``generator`` (a ``torch.Generator`` attribute, on it or
              on a batch sampler's ``sampler``), and the global RNGs (torch's, python's
              ``random``, numpy's) that its first index drew from, plus its ``epoch`` when it has
              ``set_epoch``. On resume the generator is set, the global RNGs are set only while
              the iterator is created and the received batches are skipped (then the process's
              own states are put back), and the first indices drawn (up to ``HEAD``) are compared
              with those of the checkpointed pass: a sampler whose order cannot be redrawn (an
              unseeded private RNG, a draw after its first index) raises instead of resuming
              wrongly, where that comparison can see it.

States (inside the loader state's ``sampler`` entry, JSON-serialisable)::

    {"kind": "stateful", "sampler": class name, "epoch": int (optional: its ``epoch`` when it has
        ``set_epoch``, set again before its state is loaded), "state": its state_dict() at the position, with
        tensors, numpy arrays, bytes, tuples and non-string keys tagged (see ``to_json``), or
        None (nothing received yet: iterate afresh)}
    {"kind": "custom", "sampler": class name, "generator_state": base64 (optional),
        "rng": {"torch": base64, "random": [...], "numpy": {...}} (optional: the global RNG states
        before the pass's first index, those it drew from), "epoch": int (optional),
        "rank": int (optional, the sampler's ``rank``: no index comparison on another rank),
        "head": [int, ...] (the pass's first indices, at most HEAD)}
"""

from __future__ import annotations

import base64
import random
from collections import deque
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler

from gpufeed.errors import shorten

HEAD = 16  # first indices of a pass compared on resume: a mismatch there is a wrong resume
_TAG = "__gpufeed__"  # marks a value to_json had to tag (tensor, array, bytes, tuple, dict)

CUSTOM_KINDS = ("stateful", "custom")


def is_stateful(obj: Any) -> bool:
    """Has torchdata's ``Stateful`` protocol (``state_dict()`` and ``load_state_dict()``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def custom_kind(obj: Any) -> tuple[str, Any]:
    """("stateful", the object whose state is the position) or ("custom", ``obj``), for a sampler
    or batch sampler of the user's. A ``BatchSampler`` subclass without state over a stateful
    sampler (torchdata's ``BatchSampler``) takes exactly ``batch_size`` indices a batch, so its
    sampler's state is the position, as torchdata reads it."""
    if is_stateful(obj):
        return "stateful", obj
    inner = getattr(obj, "sampler", None)
    if isinstance(obj, BatchSampler) and is_stateful(inner):
        return "stateful", inner
    return "custom", obj


def _own(obj: Any, name: str) -> Any:
    """``obj.name``, else that of the sampler ``obj`` draws from: a batch sampler's ``sampler``,
    or the user's sampler inside Lightning's ``DistributedSamplerWrapper`` (``dataset._sampler``);
    else None."""
    inner = (getattr(obj, "sampler", None), getattr(getattr(obj, "dataset", None), "_sampler", None))
    for owner in (obj, *inner):
        value = getattr(owner, name, None)
        if value is not None:
            return value
    return None


def _epoch_owner(obj: Any) -> Any:
    for owner in (obj, getattr(obj, "sampler", None)):
        if callable(getattr(owner, "set_epoch", None)) and isinstance(getattr(owner, "epoch", None), int):
            return owner
    return None


def _generator(obj: Any) -> torch.Generator | None:
    gen = _own(obj, "generator")
    return gen if isinstance(gen, torch.Generator) else None


def _rank(obj: Any) -> int | None:
    rank = _own(obj, "rank")
    return rank if isinstance(rank, int) else None


def _name(obj: Any) -> str:
    return type(obj).__qualname__


class CustomPosition:
    """The position of one pass of a custom sampler (``Pass.custom``): what it started from,
    and for a stateful one its state after each batch pulled, until the batch is received."""

    def __init__(self, kind: str, target: Any, loaded: dict[str, Any] | None, workers: bool) -> None:
        self.kind = kind
        self.target = target
        self.loaded = loaded
        # With workers the iterator pulls batches before the loader starts counting what the user
        # receives (``Pass.count_pulls`` is set after): count the user's batches only.
        self._workers = workers
        if loaded is not None and loaded.get("sampler") != _name(target):
            raise ValueError(
                f"the loaded state was taken with a sampler of class {loaded.get('sampler')!r}; this loader's is "
                f"{_name(target)!r}. Resume with the sampler of the checkpointed run."
            )
        # stateful: (relative position, state after that many batches of this stream were pulled,
        # already in JSON form); entries below the received run are dropped as it grows.
        self._snapshots: deque[tuple[int, Any, bool]] = deque()
        self._run = 0  # the received run as far as prune() has counted it
        self._seen = 0  # received batches prune() has counted
        self._got: set[int] = set()
        # custom: the start of the pass, its first indices, and the process's RNGs while swapped
        self.start: dict[str, Any] = {}
        self.head: list[int] | None = []
        self._expected: list[int] | None = None
        self._before: dict[str, Any] = {}
        self._process: dict[str, Any] | None = None

    # -- the pass's start --------------------------------------------------------------------

    def begin(self) -> None:
        """Before the pass's ``iter()``: load the state, or record (or set) its random start."""
        loaded = self.loaded
        owner = _epoch_owner(self.target)
        if loaded is not None and "epoch" in loaded and owner is not None:
            owner.set_epoch(int(loaded["epoch"]))  # the checkpointed pass's (a framework sets it later)
        if self.kind == "stateful":
            self.start = {"kind": "stateful", "sampler": _name(self.target)}
            if owner is not None:
                self.start["epoch"] = int(owner.epoch)
            state = loaded.get("state") if loaded is not None else None
            if state is not None:
                self.target.load_state_dict(from_json(state))
            self._snapshots.append((0, state, True))
            return
        gen = _generator(self.target)
        if loaded is None:
            self.start = {"kind": "custom", "sampler": _name(self.target)}
            if gen is not None:
                self.start["generator_state"] = _b64(gen.get_state())
            if owner is not None:
                self.start["epoch"] = int(owner.epoch)
            if _rank(self.target) is not None:
                self.start["rank"] = _rank(self.target)
            self._before = _global_states()
            return
        self.start = {k: v for k, v in loaded.items() if k != "head"}
        if "generator_state" in loaded:
            if gen is None:
                raise ValueError(
                    f"the loaded state was taken with a {_name(self.target)} that drew from its own `generator`; "
                    "this loader's has none. Build it with a torch.Generator as in the checkpointed run."
                )
            gen.set_state(_unb64(loaded["generator_state"]))
        other_rank = "rank" in loaded and _rank(self.target) != loaded["rank"]
        self._expected = None if other_rank else [int(i) for i in loaded.get("head", ())]
        rngs = loaded.get("rng", {})
        self._process = _global_states()
        _set_global_states(rngs)

    def end(self) -> None:
        """After the first index and the skipped batches: note which global RNGs the first
        index drew from (a fresh pass), or put the process's own states back (a resumed one)."""
        if self._process is not None:
            _set_global_states(_to_json_states(self._process))
            self._process = None
        elif self.kind == "custom" and self.loaded is None and self._before:
            now = _global_states()
            drew = {k: v for k, v in self._before.items() if not _same_state(k, v, now[k])}
            if drew:
                self.start["rng"] = _to_json_states(drew)
            self._before = {}

    # -- each pull ---------------------------------------------------------------------------

    def pulled(self, batch: Any) -> None:
        """A batch of indices came out of the stream (skipped or not): the custom kind records
        the pass's first indices, and on resume compares them with the checkpointed ones."""
        if self.kind != "custom" or self.head is None or len(self.head) >= HEAD:
            return
        ints = _indices(batch)
        if ints is None:
            self.head = None  # not integer indices: nothing to compare
            return
        for i in ints[: HEAD - len(self.head)]:
            at = len(self.head)
            if self._expected is not None and at < len(self._expected) and self._expected[at] != i:
                raise ValueError(
                    f"resuming {_name(self.target)} mid-epoch: index {at} of the resumed pass is {i}, the "
                    f"checkpointed pass's was {self._expected[at]}, so its order cannot be redrawn from the "
                    "random state gpufeed records (its `generator`, or torch's, python's or numpy's global "
                    "RNG, as they were before its first index). Give the sampler state_dict()/"
                    "load_state_dict() (torchdata's protocol), or draw its order at its first index from a "
                    "seeded `self.generator`; or checkpoint at epoch ends only."
                )
            self.head.append(i)

    def after_pull(self, number: int, p: Any) -> None:
        """Stateful kind: the sampler's state once the batch of relative number ``number`` was
        pulled (the position after ``number + 1`` batches), kept until the user has received
        the batches before it; older ones are dropped."""
        if self.kind != "stateful":
            return
        self._snapshots.append((number + 1, self.target.state_dict(), False))
        self._prune(p)

    def _prune(self, p: Any) -> None:
        received = p.yielded if self._workers else p.batches_received
        while self._seen < received:
            pull = p.delivery[self._seen] if p.delivery is not None else self._seen
            self._got.add(p.numbers[pull])
            self._seen += 1
        while self._run in self._got or self._run in p.beyond:
            self._got.discard(self._run)
            self._run += 1
        while len(self._snapshots) > 1 and self._snapshots[1][0] <= self._run:
            self._snapshots.popleft()

    # -- the state ---------------------------------------------------------------------------

    def state(self, run: int, samples: int) -> dict[str, Any]:
        """The ``sampler`` entry of the loader's state: ``run`` batches of this stream received
        (past the skipped ones), ``samples`` indices received in the whole pass."""
        if self.kind == "custom":
            state = dict(self.start)
            if self.head is not None:
                state["head"] = self.head[: min(HEAD, samples)]
            return state
        for number, value, encoded in self._snapshots:
            if number == run:
                where = f"the state_dict() of {_name(self.target)}"
                return {**self.start, "state": value if encoded else to_json(value, where)}
        raise RuntimeError(  # the bookkeeping above keeps every position from the run onward
            f"no state of {_name(self.target)} after {run} batches was kept (kept: "
            f"{[n for n, _, _ in self._snapshots]}). This is a gpufeed bug: please report it."
        )


def next_pass(obj: Any, last_epoch: int | None) -> dict[str, Any] | None:
    """Between passes, where a custom sampler's next pass draws from (``next_sampler``): its own
    generator now, and the epoch after the last pass's; None without either (a stateful
    sampler's next pass starts afresh, as with torchdata)."""
    kind, target = custom_kind(obj)
    if kind != "custom":
        return None
    state: dict[str, Any] = {"kind": "custom", "sampler": _name(target)}
    gen = _generator(target)
    if gen is not None:
        state["generator_state"] = _b64(gen.get_state())
    owner = _epoch_owner(target)
    if owner is not None:
        state["epoch"] = int(owner.epoch) if last_epoch is None else last_epoch + 1
    return state if len(state) > 2 else None


def apply_next(obj: Any, state: dict[str, Any]) -> None:
    """Load ``next_pass``'s state into a custom sampler."""
    _, target = custom_kind(obj)
    if state.get("sampler") != _name(target):
        raise ValueError(
            f"the loaded state was taken with a sampler of class {state.get('sampler')!r}; this loader's is "
            f"{_name(target)!r}. Resume with the sampler of the checkpointed run."
        )
    gen = _generator(target)
    if "generator_state" in state and gen is not None:
        gen.set_state(_unb64(state["generator_state"]))
    owner = _epoch_owner(target)
    if "epoch" in state and owner is not None:
        owner.set_epoch(int(state["epoch"]))


# -- global RNG states ---------------------------------------------------------------------------


def _global_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "random": random.getstate(), "numpy": np.random.get_state()}


def _same_state(name: str, a: Any, b: Any) -> bool:
    if name == "torch":
        return bool(torch.equal(a, b))
    if name == "numpy":
        return a[0] == b[0] and bool(np.array_equal(a[1], b[1])) and tuple(a[2:]) == tuple(b[2:])
    return bool(a == b)


def _to_json_states(states: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in states.items():
        if name == "torch":
            out[name] = _b64(value)
        elif name == "random":
            version, internal, gauss = value
            out[name] = [version, list(internal), gauss]
        else:
            key, keys, pos, has_gauss, cached = value
            out[name] = {"key": key, "state": base64.b64encode(np.ascontiguousarray(keys).tobytes()).decode(),
                         "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def _set_global_states(states: dict[str, Any]) -> None:
    if "torch" in states:
        torch.set_rng_state(_unb64(states["torch"]))
    if "random" in states:
        version, internal, gauss = states["random"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        s = states["numpy"]
        keys = np.frombuffer(base64.b64decode(s["state"]), dtype=np.uint32).copy()
        np.random.set_state((s["key"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"]))


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _indices(batch: Any) -> list[int] | None:
    """A batch of indices (or one index) as ints; None if they are not integers."""
    items: Any = batch
    if isinstance(batch, torch.Tensor):
        items = batch.reshape(-1).tolist()
    elif isinstance(batch, (int, np.integer)) or not isinstance(batch, (list, tuple, np.ndarray, range)):
        items = [batch]
    out = []
    for i in items:
        if isinstance(i, torch.Tensor) and i.numel() == 1:
            i = i.item()
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            return None
        out.append(int(i))
    return out


# -- a stateful sampler's state as JSON ------------------------------------------------------------


def to_json(value: Any, where: str) -> Any:
    """``value`` (a ``state_dict()``) as JSON-serialisable data: tensors, numpy arrays, bytes,
    tuples and dicts with keys that are not strings are tagged so ``from_json`` rebuilds them;
    anything else raises ``TypeError`` naming where it is and the type found."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        data = t.view(torch.uint8) if t.dim() > 0 else t.reshape(1).view(torch.uint8)
        return {_TAG: "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "data": base64.b64encode(data.numpy().tobytes()).decode("ascii")}
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return {_TAG: "ndarray", "dtype": a.dtype.str, "shape": list(a.shape),
                "data": base64.b64encode(a.tobytes()).decode("ascii")}
    if isinstance(value, (bytes, bytearray)):
        return {_TAG: "bytes", "data": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: to_json(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {_TAG: "dict", "items": [[to_json(k, f"{where} key"), to_json(v, f"{where}[{k!r}]")]
                                        for k, v in value.items()]}
    raise TypeError(
        f"{where} holds a {type(value).__name__} ({shorten(value)}): gpufeed's loader state is "
        "JSON-serialisable. Return numbers, strings, lists, dicts, tuples, bytes, tensors or numpy arrays."
    )


def from_json(value: Any) -> Any:
    """The value ``to_json`` encoded."""
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: from_json(v) for k, v in value.items()}
    if tag == "tensor":
        dtype = getattr(torch, value["dtype"])
        raw = torch.frombuffer(bytearray(base64.b64decode(value["data"])), dtype=torch.uint8)
        return raw.view(dtype).reshape(value["shape"]).clone()
    if tag == "ndarray":
        return np.frombuffer(base64.b64decode(value["data"]), dtype=np.dtype(value["dtype"])).reshape(
            value["shape"]).copy()
    if tag == "bytes":
        return base64.b64decode(value["data"])
    if tag == "tuple":
        return tuple(from_json(v) for v in value["items"])
    if tag == "dict":
        return {_hashable(from_json(k)): from_json(v) for k, v in value["items"]}
    raise ValueError(f"unknown tag {tag!r} in a sampler state: it was not written by gpufeed's to_json.")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key

