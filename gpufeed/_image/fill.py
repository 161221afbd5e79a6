"""The image fast path: decode, crop, resize and flip straight into the rows of a batch slot.

Used instead of ``__getitem__`` + ``collate_fn`` when the dataset is a gpufeed ``ImageSource``
with a fixed-size transform and the loader's default collate. A batch of n samples occupies its
slot as::

    [ uint8 rows: n x H x W x 3 (channels_last) or n x 3 x H x W ][ int64 labels: n ]
    [ float output: n x 3 x H x W, only with normalize/dtype ][ encoded-bytes staging ... ]

The parent writes cache hits into the slot before dispatch (decoded rows, or encoded bytes in
the staging area) and tells the worker which rows are done; the worker fills the rest, stages
the encoded bytes of misses when the cache wants them, and replies with what it kept, staged
and skipped. Results depend only on (seed, epoch, sample index), never on the worker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from gpufeed._engine.layout import align_up as _align
from gpufeed._image.normalize import Normalize, affine, check_image_output, to_float_
from gpufeed.cache import HostCache
from gpufeed.errors import DecodeError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImagePlan:
    """What every batch of an image loader looks like (picklable; travels to workers)."""

    transform: Any  # gpufeed.transforms.ImageTransform
    channels_last: bool = False
    on_error: str = "raise"
    normalize: Normalize | None = None
    dtype: torch.dtype = torch.uint8
    seed: int = 0
    cache: str | None = None  # "decoded" | "encoded" | None

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"`on_error` must be 'raise' or 'skip'. Found: {self.on_error!r}.")
        check_image_output(self.dtype, self.normalize)

    @property
    def hw(self) -> tuple[int, int]:
        return tuple(self.transform.output_size)  # type: ignore[return-value]

    @property
    def row_bytes(self) -> int:
        h, w = self.hw
        return h * w * 3

    def offsets(self, n: int) -> tuple[int, int, int]:
        """(labels, float output, staging start) byte offsets of an n-sample batch."""
        labels = _align(n * self.row_bytes)
        floats = _align(labels + 8 * n)
        staging = floats
        if self.dtype != torch.uint8:
            staging = _align(floats + n * self.row_bytes * self.dtype.itemsize)
        return labels, floats, staging

    def rows(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        """The uint8 rows as stored: (n, H, W, 3) or (n, 3, H, W)."""
        h, w = self.hw
        shape = (n, h, w, 3) if self.channels_last else (n, 3, h, w)
        return buf[: n * self.row_bytes].view(shape)


@dataclass
class ImageTask:
    """Per-batch instructions from the parent: augmentation epoch and what the cache supplied."""

    epoch: int
    done: tuple[int, ...] = ()  # positions whose rows the parent already wrote
    given: tuple[tuple[int, int, int], ...] = ()  # (position, offset, nbytes) of encoded hits
    staging_used: int = 0  # bytes of the staging area the parent used


@dataclass
class FillReport:
    kept: list[int] = field(default_factory=list)
    staged: list[tuple[int, int, int]] = field(default_factory=list)  # (position, offset, nbytes)
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (index, file, message)
    read_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0  # crop/resize/flip after the decode
    post_s: float = 0.0  # compaction and dtype/normalize over the whole batch


def fill_batch(
    plan: ImagePlan,
    source: Any,
    indices: list[int],
    task: ImageTask,
    bind: Callable[[], torch.Tensor],
    stage: Callable[[int, Any], tuple[int, int] | None] | None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], FillReport]:
    """Fill a batch in the slot ``bind()`` returns (uint8); returns ((images, labels), report).

    The slot is bound as late as possible: when the parent wrote nothing into it, the first
    image is decoded into a scratch row and the slot is bound only to copy it in (see
    ``SlotWriter.begin_late``). ``stage(position, data)`` copies a miss's encoded bytes where
    the parent can cache them.
    """
    n = len(indices)
    off_labels, off_floats, _ = plan.offsets(n)
    report = FillReport()
    done = set(task.done)
    given = {pos: (off, nbytes) for pos, off, nbytes in task.given}
    buf = bind() if done or given or stage is not None else None
    rows = None if buf is None else plan.rows(buf, n).numpy()
    scratch = None
    label_values = [0] * n
    for pos, index in enumerate(indices):
        label_values[pos] = source.label(index)
        if pos in done:
            report.kept.append(pos)
            continue
        t0 = time.perf_counter()
        if pos in given:
            off, nbytes = given[pos]
            data = buf[off : off + nbytes].numpy()
        else:
            data = source.read(index)
            if stage is not None:
                placed = stage(pos, data)
                if placed is not None:
                    report.staged.append((pos, *placed))
        t1 = time.perf_counter()
        if rows is None and scratch is None:
            scratch = plan.rows(torch.empty(plan.row_bytes, dtype=torch.uint8), 1)[0].numpy()
        try:
            decode_s = plan.transform.apply(data, index=index, epoch=task.epoch, seed=plan.seed,
                                            out=scratch if rows is None else rows[pos])
        except DecodeError as exc:
            decode_s = time.perf_counter() - t1
            where = source.describe(index)
            if plan.on_error == "raise":
                raise DecodeError(
                    f"cannot decode {where} (sample index {index}): {exc}. Check or remove the "
                    "file, or pass on_error='skip' to leave bad samples out of their batch."
                ) from exc
            report.errors.append((index, where, str(exc)))
        else:
            report.kept.append(pos)
            if rows is None:
                buf = bind()
                rows = plan.rows(buf, n).numpy()
                rows[pos] = scratch
        report.read_s += t1 - t0
        report.decode_s += decode_s
        report.transform_s += time.perf_counter() - t1 - decode_s
    t2 = time.perf_counter()
    if buf is None:  # every sample failed
        buf = bind()
    rows_t = plan.rows(buf, n)
    rows = rows_t.numpy()
    labels = buf[off_labels : off_labels + 8 * n].view(torch.int64)
    labels.copy_(torch.tensor(label_values, dtype=torch.int64))
    k = len(report.kept)
    if k < n:  # compact: kept rows move up, in order
        for dst, src in enumerate(report.kept):
            if dst != src:
                rows[dst] = rows[src]
                labels[dst] = labels[src]
    images = rows_t[:k]
    if plan.channels_last:
        images = images.permute(0, 3, 1, 2)  # NCHW shape, NHWC memory
    if plan.dtype != torch.uint8:
        images = _to_float(plan, images, buf, off_floats)
    report.post_s = time.perf_counter() - t2
    return (images, labels[:k]), report


def _to_float(plan: ImagePlan, images: torch.Tensor, buf: torch.Tensor, offset: int) -> torch.Tensor:
    """(x / 255 - mean) / std (or x / 255) over the whole batch, into the slot's float area."""
    k = images.shape[0]
    h, w = plan.hw
    nbytes = k * 3 * h * w * plan.dtype.itemsize
    flat = buf[offset : offset + nbytes].view(plan.dtype)
    if plan.channels_last:
        out = flat.view(k, h, w, 3).permute(0, 3, 1, 2)
    else:
        out = flat.view(k, 3, h, w)
    out.copy_(images)
    return to_float_(out, None if plan.normalize is None else affine(plan.normalize, plan.dtype))


class ImageFeed:
    """Parent side of the image path: cache look-ups before dispatch, cache fills after."""

    def __init__(self, plan: ImagePlan, source: Any, cache: HostCache | None, gpu_transform: Any = None) -> None:
        self.plan = plan
        self.gpu_transform = gpu_transform  # dtype/normalize applied after the copy to the GPU
        self.source = source
        self.cache = cache if plan.cache else None
        self.images = 0
        self.skipped = 0
        self._logged: set[str] = set()

    def prepare(self, epoch: int, indices: list[int], buf: torch.Tensor | None, count: bool = True) -> ImageTask:
        """Write cache hits into ``buf`` (the slot) and say which rows are done.

        ``count=False`` for a batch prepared again (re-run after a worker death): its look-ups
        were already counted as hits and misses.
        """
        task = ImageTask(epoch)
        if self.cache is None or buf is None:
            return task
        n = len(indices)
        _, _, staging = self.plan.offsets(n)
        if self.plan.cache == "decoded":
            rows = self.plan.rows(buf, n).numpy().reshape(n, -1)
            done = []
            for pos, index in enumerate(indices):
                hit = self.cache.get(index) if count else self.cache.peek(index)
                if hit is not None:
                    rows[pos] = np.frombuffer(hit, np.uint8)
                    done.append(pos)
            task.done = tuple(done)
        else:
            given, cursor = [], staging
            for pos, index in enumerate(indices):
                hit = self.cache.get(index) if count else self.cache.peek(index)
                if hit is not None:
                    buf[cursor : cursor + len(hit)].numpy()[:] = np.frombuffer(hit, np.uint8)
                    given.append((pos, cursor, len(hit)))
                    cursor = _align(cursor + len(hit))
            task.given, task.staging_used = tuple(given), cursor - staging
        return task

    def absorb(self, indices: list[int], task: ImageTask, report: FillReport, buf: torch.Tensor) -> None:
        """Count the batch; add what the worker produced to the cache; log skips once per file."""
        self.images += len(report.kept)
        self.skipped += len(report.errors)
        for index, where, message in report.errors:
            if where not in self._logged:
                self._logged.add(where)
                log.warning("gpufeed: skipped %s (sample index %d): %s", where, index, message)
        if self.cache is None:
            return
        if self.plan.cache == "decoded":
            done = set(task.done)
            rows = self.plan.rows(buf, len(indices)).numpy().reshape(len(indices), -1)
            for row, pos in enumerate(report.kept):
                if pos not in done:
                    self.cache.put(indices[pos], rows[row].tobytes())
        else:
            for pos, off, nbytes in report.staged:
                self.cache.put(indices[pos], buf[off : off + nbytes].numpy().tobytes())
