"""The targets of an image batch: int64 labels in the slot, or ``default_collate`` in the worker.

A loader's route is chosen at construction from its source (docs/design/sample-model.md,
section 4): ``"labels"`` when every target is the source's int label and there is no
``target_transform`` (the labels are written into the slot's labels region, and a batch the cache
holds whole can be made in the parent); ``"collate"`` otherwise: the worker runs the source's
``target_transform`` on each kept sample's target, in batch order, as ``DataLoader``'s workers run
it inside ``__getitem__``, then torch's own ``default_collate`` on the results, so that ints,
floats, strings, tuples, namedtuples, dicts, tensors, numpy arrays and nested mixes come out as
``DataLoader`` gives them. In a worker, the tensors it stacks are allocated in the slot (the
engine's collate rule) and the rest travels in the reply's skeleton (``transport.pack``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data._utils.collate import default_collate

from gpufeed.errors import add_note, describe_callable

TARGET_ROUTES = ("labels", "collate")


def collate_targets(source: Any, indices: Sequence[int], kept: Sequence[int], targets: Sequence[Any]) -> Any:
    """``default_collate`` of the kept samples' targets (``targets[pos]`` for ``pos`` in ``kept``,
    the raw targets of the batch's positions), each passed through ``source.target_transform``
    first when it has one. A batch whose every sample was skipped has ``[]`` for targets.
    Targets ``default_collate`` does not take (None, say) raise its TypeError, as in ``DataLoader``.

    An exception in ``target_transform`` is raised as is, with a note naming the stage, the
    sample index and the sample's file (the engine adds the worker and its pid)."""
    transform = getattr(source, "target_transform", None)
    out = []
    for pos in kept:
        target = targets[pos]
        if transform is not None:
            try:
                target = transform(target)
            except Exception as exc:
                index = indices[pos]
                add_note(exc, f"gpufeed: raised in target_transform ({describe_callable(transform)}) "
                              f"on sample index {index} ({source.describe(index)})")
                raise
        out.append(target)
    # A tuple, as DataLoader's collate sees a column of its (image, target) samples: str and
    # bytes targets come out as that tuple, as there.
    return default_collate(tuple(out)) if out else []
