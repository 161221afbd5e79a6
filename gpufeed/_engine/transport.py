"""Batch transport: the batch's structure is pickled, its tensor payloads stay in the arena.

Worker side, ``pack`` pickles any structure (dicts, tuples, namedtuples, user classes) with a
``persistent_id`` hook: every plain CPU tensor or numeric ndarray inside it is replaced by a small
reference (offset, dtype, shape, strides) into the current slot. Tensors already written into the
slot (by the arena-backed collate) cost nothing; others are copied in once per storage, so views
that shared a storage in the worker share it in the parent too. Parent side, ``unpack`` turns the
references back into views of the lease.

A CPU strided tensor *subclass* (torchvision's ``tv_tensors``: ``Image``, ``BoundingBoxes``,
``Mask``, ``KeyPoints``) travels as a plain tensor would, its payload in the slot, with its class
and ``__dict__`` (``format``, ``canvas_size``...) in the skeleton; the parent rebuilds it as
``plain.as_subclass(cls)`` with that ``__dict__``. Subclasses with their own dispatch
(``__torch_dispatch__``) or pickling (``__reduce_ex__``), and ``nn.Parameter``, are left alone.

What cannot live in the arena (sparse, quantized, nested, tensors that require grad, those
subclasses, object arrays, payloads larger than the slot) is pickled inline, as torch would.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import torch

from gpufeed._engine.arena import SlotWriter

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last one (non-negative strides)."""
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _arena_eligible(t: torch.Tensor) -> bool:
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_nested
        and not t.is_conj()
        and not t.is_neg()
        and t.numel() > 0
        and min(t.stride(), default=0) >= 0
    )


def _plain_subclass(t: torch.Tensor) -> bool:
    """A tensor subclass that is a plain tensor plus Python attributes (``tv_tensors``): no
    dispatch or pickling of its own, not a ``Parameter``."""
    cls = type(t)
    return (
        cls is not torch.Tensor
        and not isinstance(t, torch.nn.Parameter)
        and cls.__torch_dispatch__ is torch.Tensor.__torch_dispatch__
        and cls.__reduce_ex__ is torch.Tensor.__reduce_ex__
    )


class _Packer(pickle.Pickler):
    def __init__(self, file: io.BytesIO, writer: SlotWriter) -> None:
        super().__init__(file, protocol=_PROTOCOL)
        self._writer = writer
        self._storages: dict[int, tuple[int, int]] = {}  # storage data_ptr -> (offset, nbytes)
        self.overflow_bytes = 0

    def _copy_storage(self, storage: torch.UntypedStorage) -> tuple[int, int] | None:
        """Copy a storage into the slot once (views of it keep sharing it); (offset, nbytes)."""
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        placed = self._storages.get(ptr)
        if placed is None:
            off = self._writer.alloc(nbytes)
            if off is None:
                self.overflow_bytes += nbytes
                return None
            self._writer.region(off, nbytes).copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
            placed = self._storages[ptr] = (off, nbytes)
        return placed

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if _plain_subclass(obj):
                return self._subclass(obj)
            if self._writer.owns_storage(obj.untyped_storage().data_ptr()):
                return self._arena_backed(obj)
            if not _arena_eligible(obj):
                return None  # pickled inline with its own (small) storage, as torch would
            return self._copied(obj)
        if type(obj) is np.ndarray:
            return self._ndarray(obj)
        return None

    def _subclass(self, t: torch.Tensor) -> Any:
        """A tensor subclass: its plain tensor's reference, with its class and ``__dict__``;
        None (pickled inline, as torch would) when the plain tensor cannot live in the slot."""
        with torch._C.DisableTorchFunctionSubclass():
            plain = t.as_subclass(torch.Tensor)
        inner = self.persistent_id(plain)
        if inner is None:
            return None
        return ("s", type(t), dict(t.__dict__), inner)

    def _copied(self, t: torch.Tensor) -> Any:
        """A tensor with a storage of its own: the storage is copied into the slot once."""
        placed = self._copy_storage(t.untyped_storage())
        if placed is None:
            return None
        return ("t", *placed, t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), False)

    def _arena_backed(self, t: torch.Tensor) -> Any:
        """A tensor whose storage is an arena mapping: always by reference, never inline (the
        storage is a whole chunk, gigabytes of virtual memory)."""
        if t.numel() == 0:
            return ("e", t.dtype, tuple(t.shape))
        if not _arena_eligible(t):  # requires_grad / conj / neg views: a plain copy instead
            plain = t.detach().resolve_conj().resolve_neg().clone()
            placed = self._copy_storage(plain.untyped_storage())
            if placed is None:
                raise RuntimeError(
                    f"gpufeed: a {tuple(t.shape)} {t.dtype} tensor does not fit its arena slot; "
                    "raise max_batch_bytes"
                )
            return ("t", *placed, plain.dtype, tuple(plain.shape), plain.stride(), 0, t.requires_grad)
        span, ptr = _span_bytes(t), t.data_ptr()
        off = self._writer.offset_of(ptr)
        region = self._writer.region_of(ptr)
        if region is not None and off + span <= region[0] + region[1]:
            elems, rem = divmod(off - region[0], t.element_size())
            if rem == 0:  # share the region's storage, as views of one collated tensor do
                return ("t", *region, t.dtype, tuple(t.shape), t.stride(), elems, False)
        return ("t", off, span, t.dtype, tuple(t.shape), t.stride(), 0, False)

    def _ndarray(self, a: np.ndarray) -> Any:
        if a.dtype.hasobject or a.nbytes == 0:
            return None
        off = self._writer.alloc(a.nbytes)
        if off is None:
            self.overflow_bytes += a.nbytes
            return None
        self._writer.region(off, a.nbytes).numpy().view(a.dtype).reshape(a.shape)[...] = a
        return ("n", off, a.nbytes, a.dtype, a.shape)


def pack(data: Any, writer: SlotWriter) -> tuple[bytes, int, int]:
    """Pickle ``data`` with payloads in the current slot.

    Returns (skeleton bytes, slot bytes used, bytes that overflowed the slot and went inline).
    """
    buf = io.BytesIO()
    packer = _Packer(buf, writer)
    packer.dump(data)
    return buf.getvalue(), writer.pos, packer.overflow_bytes


class _SlotViews:
    """The parts of ``SlotWriter`` that ``_Packer`` uses, over a slot the parent wrote itself
    (a batch a plug-in completed without a worker): tensors are referenced where they are,
    nothing is copied (a payload outside the slot goes inline, counted as overflow)."""

    def __init__(self, slot: torch.Tensor) -> None:
        self._storage = slot.untyped_storage().data_ptr()
        self._base = slot.data_ptr()

    def owns_storage(self, storage_ptr: int) -> bool:
        return storage_ptr == self._storage

    def offset_of(self, ptr: int) -> int:
        return ptr - self._base

    def region_of(self, ptr: int) -> tuple[int, int] | None:
        return None

    def alloc(self, nbytes: int) -> int | None:
        return None

    def region(self, offset: int, nbytes: int) -> torch.Tensor:
        raise AssertionError("nothing is allocated in a parent-written slot")


class _ViewPacker(_Packer):
    def __init__(self, file: io.BytesIO, views: _SlotViews) -> None:
        super().__init__(file, views)  # type: ignore[arg-type]  # the subset _Packer uses
        self.end = 0  # end of the last slot byte a reference covers

    def persistent_id(self, obj: Any) -> Any:
        pid = super().persistent_id(obj)
        ref = pid[3] if pid is not None and pid[0] == "s" else pid
        if ref is not None and ref[0] in ("t", "n"):
            self.end = max(self.end, ref[1] + ref[2])
        return pid


def pack_views(data: Any, slot: torch.Tensor) -> tuple[bytes, int, int]:
    """Parent side: the skeleton of ``data``, whose tensors are views of ``slot`` (the whole
    slot, as ``Arena.slot_tensor`` gives it), as ``pack`` would make it in a worker.

    Returns (skeleton bytes, slot bytes the batch spans, bytes that went inline).
    """
    buf = io.BytesIO()
    packer = _ViewPacker(buf, _SlotViews(slot))
    packer.dump(data)
    return buf.getvalue(), packer.end, packer.overflow_bytes


class _Unpacker(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, lease: memoryview) -> None:
        super().__init__(file)
        self._lease = lease
        self._bases: dict[tuple[int, int], torch.Tensor] = {}

    def _base(self, off: int, nbytes: int) -> torch.Tensor:
        base = self._bases.get((off, nbytes))
        if base is None:
            base = torch.frombuffer(self._lease, dtype=torch.uint8, count=nbytes, offset=off)
            self._bases[(off, nbytes)] = base
        return base

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "s":
            _, cls, attrs, inner = pid
            t = self.persistent_load(inner).as_subclass(cls)
            t.__dict__.update(attrs)
            return t
        if kind == "t":
            _, off, nbytes, dtype, shape, stride, storage_offset, requires_grad = pid
            base = self._base(off, nbytes)
            usable = nbytes - nbytes % dtype.itemsize
            t = base[:usable].view(dtype).as_strided(shape, stride, storage_offset)
            return t.requires_grad_() if requires_grad else t
        if kind == "e":
            return torch.empty(pid[2], dtype=pid[1])
        if kind == "n":
            _, off, nbytes, dtype, shape = pid
            # Through a tensor, so the array keeps the lease (and the slot) alive.
            return self._base(off, nbytes).numpy().view(dtype).reshape(shape)
        raise pickle.UnpicklingError(f"gpufeed: unknown persistent id {kind!r} in a batch")


def unpack(skeleton: bytes, lease: memoryview) -> Any:
    """Rebuild a packed batch; its tensors are views of ``lease``."""
    return _Unpacker(io.BytesIO(skeleton), lease).load()
