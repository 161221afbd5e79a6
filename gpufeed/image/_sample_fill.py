"""The per-sample fast path's worker half: detection/segmentation samples of any size, and any
``collate_fn`` (``docs/design/detection.md``, section 1).

Per sample of a batch, in a worker: ``source.read_item(i)`` (read ahead on threads, as the image
path reads), the decode at stored orientation (as PIL's ``Image.open`` sees the file; a
sequential JPEG only down to the rows its ops read), ``source.target_of(i, record, (H, W))``,
the ``DetectionPipeline``'s joint ops with ``sample_rng(seed, epoch, i)``, and its output
stage, which writes the image tensor straight into the task's arena slot
(``SlotWriter.tensor``), so the transport references it where it lies.
Then, per batch, the loader's ``collate_fn`` on the list of samples, as ``DataLoader`` runs it;
the engine packs what it returns. Results depend only on (seed, epoch, sample index).
"""

from __future__ import annotations

import pickle
import struct
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gpufeed.errors import SKIP_HINT, DecodeError, add_note, describe_callable, shorten
from gpufeed.image._fill import ReadsOwner, SequentialReads, WorkerReads, base_source, read_ahead
from gpufeed.image._malloc import keep_freed_memory
from gpufeed.image._reads import BatchReads, ReadAhead, skip_failed_read, where
from gpufeed.image.detection._pipeline import Alloc, DetectionPipeline
from gpufeed.image.detection._sample import sample_rng
from gpufeed.image.detection._source_rows import (
    JpegRows,
    decode_source,
    is_decode_failure,
    source_sample,
    source_size,
)

if TYPE_CHECKING:
    from gpufeed._engine.arena import SlotWriter


@dataclass(frozen=True)
class SamplePlan:
    """What every batch of a per-sample loader does (picklable; travels to workers):
    ``pipeline`` per sample, then ``collate_fn`` per batch; ``seed`` keys the joint ops' draws;
    ``on_error``: ``"raise"`` or ``"skip"`` (an unreadable or undecodable sample is left out)."""

    pipeline: DetectionPipeline
    collate_fn: Callable[[list[Any]], Any]
    seed: int = 0
    on_error: str = "raise"
    cache: bool = False  # the parent keeps each sample's read (bytes, record) in its host cache

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"`on_error` must be 'raise' or 'skip'. Found: {shorten(self.on_error)}.")
        if not isinstance(self.pipeline, DetectionPipeline):
            raise TypeError(f"`pipeline` must be a DetectionPipeline. Found: {type(self.pipeline).__name__}.")


@dataclass
class SampleTask:
    """Per-batch instructions from the parent: the augmentation epoch, the batch's number, and
    the samples the host cache held, written into the slot by the parent."""

    epoch: int
    batch: int = 0
    given: tuple[tuple[int, int, int], ...] = ()  # (position, offset, nbytes) of cache blobs
    staging_used: int = 0  # bytes at the start of the slot the parent wrote


@dataclass
class SampleReport:
    """What a worker did with a batch (the engine's ``FillReport``): the positions it kept, the
    samples it skipped (index, file, message) and its stage seconds."""

    kept: list[int] = field(default_factory=list)
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    staged: list[tuple[int, int, int]] = field(default_factory=list)  # (position, offset, nbytes)
    read_s: float = 0.0  # waiting for bytes (with read-ahead, less than the reads took)
    reads: int = 0
    read_latency_s: float = 0.0  # the reads' summed duration, each timed where it ran
    read_concurrency: int = 1
    decode_s: float = 0.0
    transform_s: float = 0.0  # target_of, the joint ops and the output stage
    post_s: float = 0.0  # the collate_fn

    @property
    def samples(self) -> int:
        """Samples in the batch (the skipped ones left out)."""
        return len(self.kept)


_BLOB_HEADER = struct.Struct("<Q")


def cache_blob(data: Any, record: Any) -> bytes | None:
    """A sample's read, (encoded bytes, record), as one host-cache value: the bytes' length,
    the bytes, then the pickled record. None when the record does not pickle (not cached)."""
    try:
        tail = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None
    view = memoryview(data).cast("B")
    return b"".join((_BLOB_HEADER.pack(view.nbytes), view, tail))


def from_blob(blob: Any) -> tuple[Any, Any]:
    """(encoded bytes, record) of a :func:`cache_blob` value (the bytes: a view of ``blob``)."""
    view = memoryview(blob).cast("B")
    (n,) = _BLOB_HEADER.unpack_from(view)
    start = _BLOB_HEADER.size
    return view[start:start + n], pickle.loads(view[start + n:])


def _decode_error(source: Any, index: int, exc: DecodeError) -> DecodeError:
    return DecodeError(
        f"cannot decode {source.describe(index)} (sample index {index}): {exc}. Check or remove "
        f"the file, or pass {SKIP_HINT} to leave bad samples out of their batch.")


def _sample(plan: SamplePlan, source: Any, index: int, data: Any, record: Any, epoch: int,
            alloc: Alloc | None, report: SampleReport) -> Any:
    """One sample: decode, target, joint ops, output (``alloc``: the image's tensor). Raises a
    ``DecodeError`` naming the file; other errors get a note naming the stage, sample and file.
    A sequential JPEG is decoded when an op first reads its pixels, down to the rows read
    (``_source_rows``): its decode time still counts as ``decode_s``."""
    t0 = time.perf_counter()
    try:
        image = decode_source(data)
    except DecodeError as exc:
        report.decode_s += time.perf_counter() - t0
        raise _decode_error(source, index, exc) from exc
    t1 = time.perf_counter()
    report.decode_s += t1 - t0
    stage = "target_of"
    try:
        target = source.target_of(index, record, source_size(image))
        stage = "the pipeline's joint ops"
        sample = plan.pipeline.run(source_sample(image, target), sample_rng(plan.seed, epoch, index))
        stage = "the pipeline's output stage"
        out = plan.pipeline.output(sample, alloc)
    except DecodeError as exc:
        if is_decode_failure(image, exc):
            raise _decode_error(source, index, exc) from exc
        _note_stage(exc, stage, source, index)
        raise
    except Exception as exc:
        _note_stage(exc, stage, source, index)
        raise
    finally:
        lazy_s = image.decode_s if isinstance(image, JpegRows) else 0.0
        report.decode_s += lazy_s
        report.transform_s += time.perf_counter() - t1 - lazy_s
    return out


def _note_stage(exc: BaseException, stage: str, source: Any, index: int) -> None:
    add_note(exc, f"gpufeed: raised in {stage} of sample index {index} ({source.describe(index)}), "
                  f"in {where()}.")


def misses(indices: list[int], supplied: Container[int] | None) -> list[int]:
    """The indices to read: those whose positions (in ``supplied``) the cache did not supply."""
    return indices if not supplied else [i for pos, i in enumerate(indices) if pos not in supplied]


def fill_samples(plan: SamplePlan, source: Any, indices: list[int], task: SampleTask,
                 alloc: Callable[[int], Alloc] | None, reads: ReadAhead | None = None,
                 prefetched: BatchReads | None = None, supplied: Mapping[int, Any] | None = None,
                 stage: Callable[[int, bytes], tuple[int, int] | None] | None = None,
                 ) -> tuple[Any, SampleReport]:
    """The batch of ``indices``: each sample through the pipeline (its outputs in the tensors of
    ``alloc(position in the batch)``; None: torch's), then ``plan.collate_fn`` on the list;
    returns (batch, report). ``reads``: the worker's read-ahead; ``prefetched``: the reads
    ``SampleFiller.prefetch`` started for this task (closed here either way). ``supplied``:
    position -> :func:`cache_blob` value of the samples the host cache held (not read);
    ``stage(position, blob)``: keeps each sample read for the cache; (offset, nbytes) where it
    put it in the slot (reported in ``staged``), or None. A batch whose every sample was skipped is ``[]``."""
    to_read = misses(indices, supplied)
    batch_reads = prefetched if prefetched is not None else read_ahead(reads, source, to_read)
    order: SequentialReads | BatchReads = batch_reads or SequentialReads(source.read_item, to_read)
    report = SampleReport()
    samples: list[Any] = []
    try:
        for pos, index in enumerate(indices):
            t0 = time.perf_counter()
            try:
                if supplied and pos in supplied:
                    data, record = from_blob(supplied[pos])
                else:
                    try:
                        data, record = order.next()
                    except OSError as exc:  # a remote read failed for good, a file gone...
                        if not skip_failed_read(exc, plan.on_error, source.describe(index), index):
                            raise
                        report.errors.append((index, source.describe(index), str(exc)))
                        report.read_s += time.perf_counter() - t0
                        continue
                    blob = None if stage is None else cache_blob(data, record)
                    placed = None if blob is None or stage is None else stage(pos, blob)
                    if placed is not None:
                        report.staged.append((pos, *placed))
                report.read_s += time.perf_counter() - t0
                samples.append(_sample(plan, source, index, data, record, task.epoch,
                                       None if alloc is None else alloc(pos), report))
            except DecodeError as exc:
                if plan.on_error == "raise":
                    raise
                report.errors.append((index, source.describe(index), str(exc)))
                continue
            report.kept.append(pos)
    finally:
        if batch_reads is not None:
            batch_reads.close()
    report.reads, report.read_latency_s = order.reads_done, order.latency_s
    t1 = time.perf_counter()
    try:
        batch = plan.collate_fn(samples) if samples else []
    except Exception as exc:
        add_note(exc, f"gpufeed: raised in collate_fn ({describe_callable(plan.collate_fn)}) on the "
                      f"batch of sample indices {shorten(indices)}, in {where()}.")
        raise
    report.post_s = time.perf_counter() - t1
    return batch, report


class StackedAlloc:
    """The output stage's tensors in a worker's arena slot, laid out as ``torch.stack`` lays out
    a batch: the k-th tensor a sample asks for goes to row ``pos`` of lane k, reserved for the
    whole batch when sample 0 asks (same shape and dtype; a tensor that differs gets a region
    of its own). Stacking the batch's images or masks then copies nothing
    (``SlotWriter.stacked``). A lane is reserved only while it takes at most a quarter of the
    slot left (the slot is virtual memory: rows never written cost no pages), and not for an
    output k in ``unstackable``: one whose shapes differed within a batch, which this adds k to
    (variable-size detection images, instance masks), so that their regions, placed after the
    lane, do not spread a warm slot's pages over lane and batch from then on. When the slot is
    full, the tensor is torch's (the transport then copies it, or pickles it inline)."""

    def __init__(self, w: SlotWriter, batch_size: int, unstackable: set[int] | None = None) -> None:
        self._w, self._n = w, batch_size
        self._unstackable = set() if unstackable is None else unstackable
        self._lanes: list[tuple[tuple[int, ...], torch.dtype, torch.Tensor | None]] = []

    def __call__(self, pos: int) -> Alloc:
        """``alloc`` for the sample at position ``pos`` of the batch."""
        asked = 0

        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            nonlocal asked
            k, asked = asked, asked + 1
            if k == len(self._lanes):
                lane = None if k in self._unstackable else self._lane(shape, dtype)
                self._lanes.append((tuple(shape), dtype, lane))
            lane_shape, lane_dtype, lane = self._lanes[k]
            if tuple(shape) == lane_shape and dtype == lane_dtype:
                if lane is not None:
                    return lane[pos]
            else:
                self._unstackable.add(k)
            t = self._w.tensor(shape, dtype)
            return torch.empty(shape, dtype=dtype) if t is None else t

        return alloc

    def _lane(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        numel = 1
        for s in shape:
            numel *= s
        if self._n * numel * dtype.itemsize * 4 > self._w.capacity - self._w.pos:
            return None
        return self._w.tensor((self._n, *shape), dtype)


@dataclass(frozen=True)
class SampleFiller(ReadsOwner):
    """The per-sample path's worker half (the engine's ``BatchFiller``): ``fill_samples`` with
    the images in the task's arena slot, instead of ``__getitem__`` + ``collate_fn``. A pickled
    filler carries only its plan; its ``WorkerReads`` are made in each worker."""

    plan: SamplePlan
    _reads: WorkerReads | None = field(default=None, init=False, repr=False, compare=False)
    # outputs (by order of allocation in a sample) not laid out as a stack: see StackedAlloc
    _unstackable: set[int] = field(default_factory=set, init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[type[SampleFiller], tuple[SamplePlan]]:
        return SampleFiller, (self.plan,)

    def setup(self) -> None:
        """One OpenCV thread, and malloc keeping freed memory for the next sample
        (``gpufeed.image._malloc``)."""
        super().setup()
        keep_freed_memory()

    def prefetch(self, source: Any, indices: list[int], task: SampleTask) -> BatchReads | None:
        """Start the task's reads (after those of the tasks begun before it): the samples the
        cache did not supply."""
        source = base_source(source)
        return read_ahead(self.worker_reads().for_source(source), source,
                          misses(indices, {pos for pos, _, _ in task.given}))

    def fill(self, source: Any, indices: list[int], task: SampleTask, w: SlotWriter,
             prefetched: BatchReads | None = None, more: Callable[[], None] | None = None,
             ) -> tuple[Any, SampleReport]:
        """The batch of ``indices`` (``more``: takes the tasks that reached the worker since, so
        their reads begin during this fill)."""
        source = base_source(source)
        supplied = None
        if task.given:  # the cache's blobs, which the parent wrote at the start of the slot
            buf = w.buffer
            supplied = {pos: buf[off:off + nbytes].numpy() for pos, off, nbytes in task.given}
        w.seek(task.staging_used)  # what this fill allocates goes after them
        stage = (lambda pos, blob: w.stage(blob)) if self.plan.cache else None
        return self.with_reads(source, more, lambda reads: fill_samples(
            self.plan, source, indices, task, StackedAlloc(w, len(indices), self._unstackable), reads, prefetched,
            supplied, stage))
