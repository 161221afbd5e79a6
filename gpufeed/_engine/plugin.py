"""The plug-in interface: how a batch path that is not fetch + collate (the image path) runs on
the engine without the engine knowing what it does.

A plug-in has two halves:

* ``BatchFiller``, the worker half: pickled into every worker with its ``WorkerSpec``. Its
  ``setup()`` runs once per worker process, and its ``teardown()`` once when the worker leaves
  its task loop (releasing what the filler made there); its ``fill()`` replaces the dataset
  fetch and the ``collate_fn`` for each task, writing straight into the task's arena slot. Its
  ``prefetch()`` runs when the worker takes a task, and for the tasks already queued behind it,
  before the current one is filled: it may start work without side effects on gpufeed's state
  (the image path starts reads) and returns a handle that ``fill()`` consumes, or that the
  worker closes unused when the task is skipped.
* ``FillPlugin``, the parent half: ``prepare()`` runs when a task is submitted (or re-sent
  after its worker died) and may write into the task's slot first (cache hits); what it returns
  travels as ``Task.extra``. ``absorb()`` runs when the batch is handed out, with the slot
  still readable (to fill a cache). ``look_up()`` runs first at submission, before a slot is
  bound: it may say that the plug-in makes the whole batch itself (the image path, when the
  cache holds every row); then no worker is involved, and ``complete()`` builds the batch when
  it is handed out (``Engine.result``), in a slot bound then: the one freed last, whose pages
  are warm and often still in the CPU caches. A plug-in that subclasses ``FillPlugin`` and
  keeps its default ``look_up`` never completes a task; ``FastIter`` starts workers lazily, each
  at its first task. ``parent_binds`` says whether ``prepare`` writes slots: a task's slot is
  then bound at submission and workers do not swap it for a warm one, unless its look-up says
  that ``prepare`` writes nothing (``LookUp.writes``: a batch of misses, as in a cold epoch).

The parent also enters ``EngineContext.fork_guard()`` around every ``Process.start()`` under
the fork start method (OpenCV's thread pool must be single-threaded in a forked child).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from gpufeed._engine.arena import SlotWriter


class PassTag(NamedTuple):
    """FastIter's ``tag`` of a task: the pass's augmentation epoch and the batch's number in the
    pass (counted from the pass's first batch, the batches a resumed pass skipped included), so
    a plug-in can key per-batch random draws by position, never by worker."""

    epoch: int
    batch: int


class FillReport(Protocol):
    """What ``BatchFiller.fill`` reports about one batch (it travels in ``Done.report``)."""

    @property
    def read_s(self) -> float:
        """Seconds spent reading the samples (the fetch stage of the timing)."""

    @property
    def samples(self) -> int:
        """Samples in the batch as filled (the ones a filler left out are not counted)."""


@dataclass(frozen=True, slots=True)
class Completed:
    """What ``FillPlugin.complete`` made: the batch (its tensors views of the slot) and its report.

    ``layout``: a hashable that fixes the batch's structure, dtypes, shapes and places in the
    slot (the image path: the batch size), or None. The engine packs the first batch of each
    layout and reuses its skeleton for the next ones.
    """

    batch: Any
    report: FillReport
    layout: Hashable | None = None


@dataclass(frozen=True)
class LookUp:
    """What ``FillPlugin.look_up`` found for a task at submission.

    ``report`` set: the plug-in makes the whole batch in the parent; ``extra`` is then what its
    ``complete`` gets when the batch is handed out, and ``report`` (the batch's report, which a
    driver may read before ``Engine.result``) is the one the reply carries. ``report`` None: the
    task goes to a worker, and ``extra`` is passed to ``prepare`` (so nothing is looked up twice).
    ``writes`` False: ``prepare`` will write nothing into the slot (no hits), so the task is
    dispatched as without a cache: a cold fallback that its worker may swap for a warm slot.
    """

    extra: Any
    report: FillReport | None = None
    writes: bool = True


class Prefetched(Protocol):
    """What ``BatchFiller.prefetch`` started for one task."""

    def close(self) -> None:
        """Stop or wait out what is still running and release what it holds (idempotent)."""


class BatchFiller(Protocol):
    """Worker half of a plug-in (picklable: it travels to spawned workers)."""

    def setup(self) -> None:
        """Once per worker process, after the engine's own set-up (one torch thread)."""

    def teardown(self) -> None:
        """Once per worker process, when it leaves its task loop (an ``Exit``, the parent gone,
        an error): release what ``setup``, ``prefetch`` and ``fill`` made in this process
        (threads). Runs before the engine stops the process's thread pools."""

    def prefetch(self, dataset: Any, index: Any, extra: Any, /) -> Prefetched | None:
        """Start the work of a task the worker will fill later (reads), in task order."""

    def fill(self, dataset: Any, index: Any, extra: Any, writer: SlotWriter, prefetched: Any,
             more: Callable[[], None], /) -> tuple[Any, FillReport]:
        """Build the batch of ``index`` (``extra``: what ``FillPlugin.prepare`` returned;
        ``prefetched``: what ``prefetch`` returned for it) in the writer's current slot; returns
        (batch, report). The batch is packed like a collated one. ``more()`` takes the tasks
        that reached the worker since this one began and calls ``prefetch`` for them (cheap: one
        non-blocking poll when none waits); call it when there is room to start more work."""


class FillPlugin(Protocol):
    """Parent half of a plug-in. A plug-in subclasses it for the defaults of ``look_up`` (found
    nothing: the task goes to a worker) and ``complete`` (never called then)."""

    filler: BatchFiller  # the worker half

    @property
    def parent_binds(self) -> bool:
        """``prepare`` writes into task slots (so a slot is bound when its task is submitted)."""

    def prepare(self, tag: Any, index: Any, slot: torch.Tensor, count: bool, found: Any = None, /) -> Any:
        """Per-task data for the worker (``Task.extra``), possibly written into ``slot`` (the
        whole slot as uint8). ``tag``: the value the driver submitted the task with (FastIter:
        a ``PassTag``). ``count`` is False when a task is prepared again for a
        replacement worker. ``found``: the ``LookUp.extra`` of the task's look-up at submission
        (None when it found nothing, or the task is prepared again after a death; the engine
        then passes only the first four arguments)."""

    def absorb(self, index: Any, extra: Any, report: Any, slot: torch.Tensor, /) -> None:
        """A batch is handed out; ``slot`` holds what the worker wrote."""

    def task_index(self, index: Any, /) -> Any:
        """The index a task carries for the sampler's ``index``: what ``look_up``, ``prepare``,
        ``absorb`` and the worker's ``fill`` get (the image path over a Subset: its base
        dataset's indices). By default ``index`` itself."""
        return index

    def look_up(self, tag: Any, index: Any, count: bool, /) -> LookUp:
        """At submission, before any slot is bound: whether the plug-in will make the whole
        batch of ``index`` itself (``LookUp.report`` set), and what it found for ``prepare``
        otherwise. By default nothing: the task goes to a worker."""
        return LookUp(None)

    def complete(self, index: Any, extra: Any, slot: torch.Tensor, /) -> Completed:
        """Make the batch of a task whose look-up said so (``extra``: ``LookUp.extra``) in
        ``slot`` (the whole slot as uint8, bound when the batch is handed out), the batch's
        tensors being views of ``slot``; the engine packs them as a worker's reply. Called only
        for a task whose ``look_up`` set ``LookUp.report``."""
        raise RuntimeError(
            f"gpufeed: {type(self).__name__}.look_up said it completes a batch, but it has no complete()")
