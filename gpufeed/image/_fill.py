"""The image fast path: decode, crop, resize and flip straight into the rows of a batch slot.

Used instead of ``__getitem__`` + ``collate_fn`` when the dataset is a gpufeed ``ImageSource``
with a fixed-size transform and the loader's default collate. A batch of n samples occupies its
slot as::

    [ uint8 rows: n x H x W x 3 (channels_last) or n x 3 x H x W ][ int64 labels: n ]
    [ float output: n x 3 x H x W, only with normalize/dtype ][ encoded-bytes staging ... ]

(``ImagePlan.layout``: the named regions of ``gpufeed.image._slot``.) The labels region holds
int labels; other targets are collated by ``default_collate`` in the worker
(``gpufeed.image._targets``), as ``ImagePlan.targets`` says.

The parent (``gpufeed._fastpath.feed.ImageFeed``) writes cache hits into the slot before dispatch
(decoded rows, or encoded bytes in the staging area) and tells the worker which rows are done;
the worker (``ImageFiller``, the engine's ``BatchFiller``) fills the rest, stages the encoded
bytes of misses when the cache wants them, and replies with what it kept, staged and skipped.
Results depend only on (seed, epoch, sample index), never on the worker.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Subset

from gpufeed.errors import SKIP_HINT, DecodeError, shorten
from gpufeed.image._auto_reads import AutoReads
from gpufeed.image._batch_ops import BatchOp, MixParams, batch_rng
from gpufeed.image._normalize import Normalize, affine, check_image_output, convert_, work_dtype
from gpufeed.image._reads import BatchReads, ReadAhead, skip_failed_read
from gpufeed.image._slot import SlotLayout, slot_layout
from gpufeed.image._targets import TARGET_ROUTES, collate_targets
from gpufeed.image._views import MultiView
from gpufeed.image.augment._base import RowOps

if TYPE_CHECKING:
    from gpufeed._engine.arena import SlotWriter


@dataclass(frozen=True)
class ImagePlan:
    """What every batch of an image loader looks like (picklable; travels to workers)."""

    transform: Any  # gpufeed.image.ImageTransform
    channels_last: bool = False
    on_error: str = "raise"
    normalize: Normalize | None = None
    dtype: torch.dtype = torch.uint8
    seed: int = 0
    cache: str | None = None  # "decoded" | "encoded" | None
    targets: str = "labels"  # "labels" | "collate": the targets' route (gpufeed.image._targets)
    # MixUp/CutMix over each batch (gpufeed.image._batch_ops), on the labels route only; with
    # ``device="cuda"`` (``batch_op_on_gpu``) the worker only draws its parameters.
    batch_op: BatchOp | None = None
    batch_op_on_gpu: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"`on_error` must be 'raise' or 'skip'. Found: {shorten(self.on_error)}.")
        if self.targets not in TARGET_ROUTES:
            raise ValueError(f"`targets` must be one of {TARGET_ROUTES}. Found: {shorten(self.targets)}.")
        check_image_output(self.dtype, self.normalize)
        if self.batch_op is not None and self.targets != "labels":
            raise ValueError("a batch op (MixUp, CutMix) needs int labels in the slot (targets='labels').")

    @property
    def views(self) -> tuple[Any, ...]:
        """The transform of each output of a sample: the transform alone, or a ``MultiView``'s."""
        return tuple(self.transform.views)

    @property
    def multi(self) -> bool:
        """The batch's image part is a list of view batches (a ``MultiView``, even of one)."""
        return isinstance(self.transform, MultiView)

    @property
    def hw(self) -> tuple[int, int]:
        """(height, width) of view 0 (the only one of a single-view transform)."""
        return tuple(self.views[0].output_size)

    @property
    def row_bytes(self) -> int:
        h, w = self.hw
        return h * w * 3

    def describe_sizes(self) -> str:
        """The views' sizes for messages: "(224, 224)", or "views (224, 224) x 2, (96, 96) x 6"."""
        sizes = [tuple(v.output_size) for v in self.views]
        if not self.multi:
            return str(sizes[0])
        runs: list[list[Any]] = []
        for size in sizes:
            if runs and runs[-1][0] == size:
                runs[-1][1] += 1
            else:
                runs.append([size, 1])
        return "views " + ", ".join(f"{size} x {count}" for size, count in runs)

    def layout(self, n: int) -> SlotLayout:
        """Where the regions of an n-sample batch lie in its slot (``slot_layout``)."""
        itemsize = 0 if self.dtype == torch.uint8 else self.dtype.itemsize
        row_bytes = [h * w * 3 for h, w in (v.output_size for v in self.views)]
        soft = 0 if self.batch_op is None or self.batch_op_on_gpu else 4 * self.batch_op.num_classes
        return slot_layout(n, row_bytes, itemsize, labels=self.targets == "labels", soft_bytes=soft)

    def rows(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        """View 0's uint8 rows as stored: (n, H, W, 3) or (n, 3, H, W)."""
        return self.view_rows(buf, n)[0]

    def view_rows(self, buf: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Each view's uint8 rows as stored, over its region of the slot."""
        layout = self.layout(n)
        rows = []
        for view, region in zip(self.views, layout.views):
            h, w = view.output_size
            shape = (n, h, w, 3) if self.channels_last else (n, 3, h, w)
            rows.append(region.of(buf).view(shape))
        return rows

    def apply(self, data: Any, index: int, epoch: int, outs: list[Any]) -> float:
        """Decode one sample's bytes into its row of each view (``outs``); the decode seconds."""
        if self.multi:
            return self.transform.apply_views(data, index=index, epoch=epoch, seed=self.seed, outs=outs)
        return self.transform.apply(data, index=index, epoch=epoch, seed=self.seed, out=outs[0])


@dataclass
class ImageTask:
    """Per-batch instructions from the parent: augmentation epoch and what the cache supplied."""

    epoch: int
    batch: int = 0  # the batch's number in the pass (a batch op's draws are keyed by it)
    done: tuple[int, ...] = ()  # positions whose rows the parent already wrote
    given: tuple[tuple[int, int, int], ...] = ()  # (position, offset, nbytes) of encoded hits
    staging_used: int = 0  # bytes of the staging area the parent used


@dataclass
class FillReport:
    """What a worker did with a batch: which positions it kept, staged and skipped; stage times."""

    kept: list[int] = field(default_factory=list)
    staged: list[tuple[int, int, int]] = field(default_factory=list)  # (position, offset, nbytes)
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (index, file, message)
    read_s: float = 0.0  # the decoding thread's wait for bytes (with read-ahead, less than a read)
    reads: int = 0  # reads of the source for this batch
    read_latency_s: float = 0.0  # their summed duration, each timed where it ran (storage latency)
    read_concurrency: int = 1  # reads in flight the worker allowed for this batch (1: sequential)
    decode_s: float = 0.0
    transform_s: float = 0.0  # crop/resize/flip after the decode
    post_s: float = 0.0  # compaction and dtype/normalize over the whole batch

    @property
    def samples(self) -> int:
        """Samples in the batch (the skipped ones left out)."""
        return len(self.kept)


def fill_batch(
    plan: ImagePlan,
    source: Any,
    indices: list[int],
    task: ImageTask,
    bind: Callable[[], torch.Tensor],
    stage: Callable[[int, Any], tuple[int, int] | None] | None,
    reads: ReadAhead | None = None,
    prefetched: BatchReads | None = None,
) -> tuple[tuple[Any, ...], FillReport]:
    """Fill a batch in the slot ``bind()`` returns (uint8); returns ((images, targets), report).

    The slot is bound as late as possible: when the parent wrote nothing into it, the first
    image is decoded into a scratch row and the slot is bound only to copy it in (see
    ``SlotWriter.begin_late``). ``stage(position, data)`` copies a miss's encoded bytes where
    the parent can cache them. A miss's bytes and target come from one ``source.read_item``
    call; with ``reads``, the misses are read ahead on threads while earlier ones decode.
    ``prefetched``: the reads ``begin_reads`` started for this task (closed here either way).
    """
    batch_reads = prefetched
    if batch_reads is None:
        batch_reads = begin_reads(reads, source, indices, task)
    order: SequentialReads | BatchReads = batch_reads or SequentialReads(source.read_item, _misses(indices, task))
    try:
        out, report = _fill(plan, source, indices, task, bind, stage, order)
    finally:
        if batch_reads is not None:
            batch_reads.close()
    report.reads, report.read_latency_s = order.reads_done, order.latency_s
    return out, report


def _misses(indices: list[int], task: ImageTask) -> list[int]:
    """The indices the worker reads: those whose rows or bytes the parent did not supply."""
    supplied = set(task.done) | {pos for pos, _, _ in task.given}
    return [index for pos, index in enumerate(indices) if pos not in supplied]


def begin_reads(reads: ReadAhead | None, source: Any, indices: list[int], task: ImageTask,
                ) -> BatchReads | None:
    """Start reading the task's misses on ``reads`` (None: they are read one at a time)."""
    return read_ahead(reads, source, _misses(indices, task))


def read_ahead(reads: ReadAhead | None, source: Any, indices: list[int]) -> BatchReads | None:
    """Start reading ``indices`` (``source.read_item``) on ``reads``; None when there is no
    read-ahead or fewer than two reads (they are then read one at a time: ``SequentialReads``)."""
    if reads is None or len(indices) < 2:
        return None
    return reads.batch(source.read_item, indices)


class SequentialReads:
    """Reads one sample at a time, at its turn (the main process, or read_concurrency=1)."""

    def __init__(self, read: Callable[[int], tuple[Any, Any]], indices: list[int]) -> None:
        self._read, self._indices, self._next = read, indices, 0
        self.reads_done = 0
        self.latency_s = 0.0

    def next(self) -> tuple[Any, Any]:
        index = self._indices[self._next]
        self._next += 1
        self.reads_done += 1
        t0 = time.perf_counter()
        try:
            return self._read(index)
        finally:
            self.latency_s += time.perf_counter() - t0


def _fill(
    plan: ImagePlan,
    source: Any,
    indices: list[int],
    task: ImageTask,
    bind: Callable[[], torch.Tensor],
    stage: Callable[[int, Any], tuple[int, int] | None] | None,
    reads: SequentialReads | BatchReads,
) -> tuple[tuple[Any, ...], FillReport]:
    n = len(indices)
    report = FillReport()
    done = set(task.done)
    given = {pos: (off, nbytes) for pos, off, nbytes in task.given}
    buf = bind() if done or given or stage is not None else None
    rows = None if buf is None else [r.numpy() for r in plan.view_rows(buf, n)]
    scratch: list[Any] | None = None
    targets: list[Any] = [0] * n
    for pos, index in enumerate(indices):
        if pos in done:
            targets[pos] = source.target(index)
            report.kept.append(pos)
            continue
        t0 = time.perf_counter()
        if pos in given:
            targets[pos] = source.target(index)
            assert buf is not None  # bound above: the parent wrote into the slot
            off, nbytes = given[pos]
            data = buf[off : off + nbytes].numpy()
        else:
            try:
                data, targets[pos] = reads.next()
            except OSError as exc:  # a remote read failed for good, a file gone or unreadable...
                if not skip_failed_read(exc, plan.on_error, source.describe(index), index):
                    raise
                report.errors.append((index, source.describe(index), str(exc)))
                report.read_s += time.perf_counter() - t0
                continue
            if stage is not None:
                placed = stage(pos, data)
                if placed is not None:
                    report.staged.append((pos, *placed))
        t1 = time.perf_counter()
        if rows is None and scratch is None:
            one = torch.empty(plan.layout(1).views[-1].end, dtype=torch.uint8)
            scratch = [r[0].numpy() for r in plan.view_rows(one, 1)]
        outs = scratch if rows is None else [r[pos] for r in rows]
        assert outs is not None  # made above when the slot is not bound yet
        try:
            decode_s = plan.apply(data, index, task.epoch, outs)
        except DecodeError as exc:
            decode_s = time.perf_counter() - t1
            where = source.describe(index)
            if plan.on_error == "raise":
                raise DecodeError(
                    f"cannot decode {where} (sample index {index}): {exc}. Check or remove the "
                    f"file, or pass {SKIP_HINT} to leave bad samples out of their batch."
                ) from exc
            report.errors.append((index, where, str(exc)))
        else:
            report.kept.append(pos)
            if rows is None:
                assert scratch is not None
                buf = bind()
                rows = [r.numpy() for r in plan.view_rows(buf, n)]
                for view_rows, row in zip(rows, scratch):
                    view_rows[pos] = row
        report.read_s += t1 - t0
        report.decode_s += decode_s
        report.transform_s += time.perf_counter() - t1 - decode_s
    t2 = time.perf_counter()
    if buf is None:  # every sample failed
        buf = bind()
    batch = _finish(plan, source, indices, task, report, targets, buf)
    report.post_s = time.perf_counter() - t2
    return batch, report


def _finish(plan: ImagePlan, source: Any, indices: list[int], task: ImageTask, report: FillReport,
            targets: list[Any], buf: torch.Tensor) -> tuple[Any, ...]:
    """The batch's end, once per batch: write the labels (or collate the targets), then per view
    (``_finish_view``) move the kept rows up, convert (with the batch op's parameters, fused into
    the dtype pass) and run the float ops; returns (images, targets) of the kept rows, images a
    list of view batches for a ``MultiView`` (with ``device="cuda"`` and a batch op: (images,
    labels, the op's ``MixParams``), the GPU applying it)."""
    n = len(indices)
    layout = plan.layout(n)
    labels = None
    if plan.targets == "labels":
        labels = layout.labels.of(buf).view(torch.int64)
        labels.copy_(torch.tensor(targets, dtype=torch.int64))
    k = len(report.kept)
    if labels is not None and k < n:  # compact: kept labels move up, in order
        for dst, src in enumerate(report.kept):
            if dst != src:
                labels[dst] = labels[src]
    op = plan.batch_op  # single-view plans only (refused with a MultiView at construction)
    params = None if op is None else op.draw(batch_rng(plan.seed, task.epoch, task.batch), k, *plan.hw)
    rows = plan.view_rows(buf, n)
    images = [_finish_view(plan, view, rows[v], layout.floats[v].start if layout.floats else 0,
                           buf, report.kept, [indices[pos] for pos in report.kept], task.epoch, params)
              for v, view in enumerate(plan.views)]
    image_part: Any = images if plan.multi else images[0]
    if labels is None:
        return image_part, collate_targets(source, indices, report.kept, targets)
    if op is None or params is None:
        return image_part, labels[:k]
    if plan.batch_op_on_gpu:
        return image_part, labels[:k], params
    soft = layout.soft.of(buf)[: 4 * k * op.num_classes].view(torch.float32).view(k, op.num_classes)
    return image_part, op.soft_targets(labels[:k], params, out=soft)


def _finish_view(plan: ImagePlan, view: Any, rows_t: torch.Tensor, float_start: int,
                 buf: torch.Tensor, kept: list[int], kept_indices: list[int], epoch: int,
                 params: MixParams | None = None) -> torch.Tensor:
    """One view's rows: the kept ones moved up (in order), converted to the output dtype and
    layout (into the float region from ``float_start``) with the batch op's ``params`` (CutMix
    pasted on uint8, MixUp fused into the conversion; in the workers only), then the view's
    float ops."""
    k = len(kept)
    if k < rows_t.shape[0]:
        rows = rows_t.numpy()
        for dst, src in enumerate(kept):
            if dst != src:
                rows[dst] = rows[src]
    images = rows_t[:k]
    if plan.channels_last:
        images = images.permute(0, 3, 1, 2)  # NCHW shape, NHWC memory
    if plan.batch_op_on_gpu:
        params = None  # the GPU mixes after the copy
    if plan.dtype != torch.uint8:
        images = _to_float(plan, images, buf, float_start, params)
    elif params is not None and plan.batch_op is not None:
        plan.batch_op.paste_(images, params)  # uint8 output: CutMix only (a MixUp is refused at construction)
    float_ops = getattr(view, "float_ops", ())
    if float_ops:  # after normalize, as torchvision and timm run RandomErasing
        row_ops = RowOps(float_ops=float_ops)
        for k_pos, index in enumerate(kept_indices):
            row = images[k_pos]
            result = row_ops.apply_float(row, plan.seed, epoch, index, getattr(view, "view", 0))
            if result is not row:
                row.copy_(torch.as_tensor(result))
    return images


def _to_float(plan: ImagePlan, images: torch.Tensor, buf: torch.Tensor, offset: int,
              params: MixParams | None = None) -> torch.Tensor:
    """(x / 255 - mean) / std (or x / 255) over the whole batch (of one view, NCHW shape), into
    the slot's float area from ``offset``, with the batch op's ``params`` applied in the same pass
    (``BatchOp.convert``)."""
    k, _, h, w = images.shape
    nbytes = k * 3 * h * w * plan.dtype.itemsize
    flat = buf[offset : offset + nbytes].view(plan.dtype)
    if plan.channels_last:
        out = flat.view(k, h, w, 3).permute(0, 3, 1, 2)
    else:
        out = flat.view(k, 3, h, w)
    constants = None if plan.normalize is None else affine(plan.normalize, work_dtype(plan.dtype))
    if plan.batch_op is not None and params is not None:
        return plan.batch_op.convert(out, images, constants, params)
    return convert_(out, images, constants)


class WorkerReads:
    """One process's reads on the image path: its read-ahead (``ReadAhead``, made when a source
    asks for more than one read in flight) and, for a source with ``read_auto``, its automatic
    concurrency (``AutoReads``). Owned by an ``ImageFiller`` and made in the process that fills
    (a worker), never pickled nor used across a fork; :meth:`stop` ends its read threads."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # the process it was made in (the filler makes a new one elsewhere)
        self.ahead: ReadAhead | None = None
        self.auto: AutoReads | None = None

    def for_source(self, source: Any) -> ReadAhead | None:
        """The read-ahead for ``source`` (None when it reads one sample at a time). A source with
        ``read_auto`` reads ahead once its reads stall the worker (``AutoReads``); a source with
        other settings (concurrency, budget) than the read-ahead's stops it for a new one."""
        if getattr(source, "read_auto", False):
            if self.auto is None:
                self.auto = AutoReads()
            concurrency = self.auto.concurrency
        else:
            concurrency = int(getattr(source, "read_concurrency", 1) or 1)
        if concurrency <= 1:
            return None
        budget = int(getattr(source, "read_budget_bytes", 0) or 0)
        ahead = self.ahead
        if ahead is None or (ahead.concurrency, ahead.budget_bytes) != (concurrency, budget):
            if ahead is not None:
                ahead.stop()  # its threads end (another source's settings)
            ahead = self.ahead = ReadAhead(concurrency, budget)
        return ahead

    def observe(self, source: Any, report: Any) -> None:
        """Take a filled task's figures (``AutoReads.observe``; ``read_auto`` sources only)."""
        if self.auto is not None and getattr(source, "read_auto", False):
            self.auto.observe(report.read_s, report.reads, report.read_latency_s,
                              report.decode_s + report.transform_s, report.samples)

    def stop(self) -> None:
        """Close the open tasks' reads and end the read threads (idempotent; a later task
        starts new ones)."""
        if self.ahead is not None:
            self.ahead.stop()


MAX_SUBSETS = 64  # Subsets of Subsets deeper than this are not followed (a cycle, or a mistake)


def base_source(dataset: Any) -> Any:
    """The dataset under ``dataset``'s chain of ``torch.utils.data.Subset``s (``dataset`` itself
    when it is none): a filler reads the gpufeed dataset a loader's Subset is cut from, the
    task's indices being already that dataset's (``gpufeed._fastpath.subsets``)."""
    for _ in range(MAX_SUBSETS):
        if not isinstance(dataset, Subset):
            break
        dataset = dataset.dataset
    return dataset


class ReadsOwner:
    """What a filler that reads in its worker shares (``ImageFiller``, ``SampleFiller``): one
    OpenCV thread per worker, and this process's ``WorkerReads`` in ``_reads``, made at its
    first use in each process and ended by :meth:`teardown`."""

    _reads: WorkerReads | None

    def setup(self) -> None:
        """One OpenCV thread per worker."""
        if "cv2" not in sys.modules:
            import cv2  # a fresh import (spawn, or a parent without cv2) may be configured safely

            cv2.setNumThreads(1)  # (inherited via fork, the parent already forked us at 1 thread)

    def teardown(self) -> None:
        """End this process's read threads (the worker leaves its task loop)."""
        reads = self._reads
        if reads is not None and reads.pid == os.getpid():
            reads.stop()

    def worker_reads(self) -> WorkerReads:
        """This process's ``WorkerReads`` (made at the first call in each process)."""
        reads = self._reads
        if reads is None or reads.pid != os.getpid():
            reads = WorkerReads()
            object.__setattr__(self, "_reads", reads)  # frozen: the plan never changes, this does
        return reads

    def with_reads(self, source: Any, more: Callable[[], None] | None,
                   fill: Callable[[ReadAhead | None], tuple[Any, Any]]) -> tuple[Any, Any]:
        """``fill(reads)`` with this process's read-ahead for ``source`` (``more``: takes the
        tasks that reached the worker since, so their reads begin during the fill); the report
        it returns gets the reads in flight, and the source's automatic read-ahead its figures."""
        worker = self.worker_reads()
        reads = worker.for_source(source)
        if reads is not None:
            reads.more = more
        try:
            out, report = fill(reads)
        finally:
            if reads is not None:
                reads.more = None
        report.read_concurrency = 1 if reads is None else reads.concurrency
        worker.observe(source, report)
        return out, report


@dataclass(frozen=True)
class ImageFiller(ReadsOwner):
    """The image path's worker half (the engine's ``BatchFiller``): ``fill_batch`` into the
    task's arena slot, instead of ``__getitem__`` + ``collate_fn``.

    Made in the parent; what a worker reads with (``WorkerReads``) is made in the worker at its
    first task and ended by :meth:`teardown`: a pickled filler carries only its plan, and a
    forked one makes its own."""

    plan: ImagePlan
    _reads: WorkerReads | None = field(default=None, init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[type[ImageFiller], tuple[ImagePlan]]:
        return ImageFiller, (self.plan,)  # the plan only: read state belongs to one process

    def prefetch(self, source: Any, indices: list[int], task: ImageTask) -> BatchReads | None:
        """Start the task's reads (after those of the tasks begun before it)."""
        source = base_source(source)
        return begin_reads(self.worker_reads().for_source(source), source, indices, task)

    def fill(self, source: Any, indices: list[int], task: ImageTask, w: SlotWriter,
             prefetched: BatchReads | None = None, more: Callable[[], None] | None = None,
             ) -> tuple[tuple[Any, ...], FillReport]:
        """Lay the batch out in the slot, stage encoded misses after the parent's hits;
        ``prefetched``: what :meth:`prefetch` returned for this task; ``more``: takes the
        tasks that reached the worker since, so their reads begin during this fill."""
        plan = self.plan
        source = base_source(source)
        layout = plan.layout(len(indices))
        if layout.planned_bytes > w.capacity:
            raise ValueError(
                f"a batch of {len(indices)} images of {plan.describe_sizes()} needs {layout.planned_bytes} bytes of "
                f"arena slot, more than max_batch_bytes={w.capacity}; raise max_batch_bytes or lower "
                "batch_size"
            )
        for region in (*layout.views, layout.labels, *layout.floats):
            if region.nbytes:
                w.mark(region.start, region.nbytes)
        w.seek(layout.staging + task.staging_used)

        def stage(pos: int, data: Any) -> tuple[int, int] | None:
            return w.stage(data)

        return self.with_reads(source, more, lambda reads: fill_batch(
            plan, source, indices, task, lambda: w.buffer,
            stage if plan.cache == "encoded" else None, reads, prefetched))
