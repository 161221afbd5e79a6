"""``gpufeed.explain(loader)``'s text: the path a loader takes (the image fast path, its
per-sample form, or the generic one), why, and what runs where."""

from __future__ import annotations

from typing import Any

from gpufeed._fastpath.feed import explain_batch_op, fast_path_blocker
from gpufeed._fastpath.samples import GENERIC_PATH, SAMPLE_PATH, explain_samples
from gpufeed._fastpath.subsets import fast_dataset
from gpufeed.image import explain_transform
from gpufeed.image.detection import DetectionPipeline, translate_detection
from gpufeed.sources import ImageSource
from gpufeed.sources._detection import DetectionSource

_IMAGE_PATH = "the image fast path (decode, crop and resize straight into the batch)"


def explain_loader(loader: Any, fast: bool) -> str:
    """The lines of ``explain(loader)``; ``fast``: a ``FastLoader`` (else torch's ``DataLoader``,
    told the path a ``FastLoader`` with its arguments would take)."""
    dataset = fast_dataset(loader.dataset)
    detection = isinstance(dataset, DetectionSource)
    name = SAMPLE_PATH if detection else _IMAGE_PATH
    if fast:
        reason = loader._path_reason
        head = (f"{type(loader).__name__}: "
                + (f"{name}." if reason is None else f"{GENERIC_PATH}, because {reason}."))
    else:
        reason = fast_path_blocker(loader)
        head = (f"{type(loader).__name__}: torch's own per-sample path (__getitem__ + collate). "
                "gpufeed.FastLoader with the same arguments would take "
                + (f"{SAMPLE_PATH if detection else 'the image fast path'}." if reason is None
                   else f"{GENERIC_PATH}, because {reason}."))
    if fast and reason is None and getattr(loader, "batch_transform", None) is not None:
        head += "\n" + explain_batch_op(loader.batch_transform, loader.device is not None)
    if detection and reason is None:
        cache = getattr(loader, "cache_bytes", 0) if fast else 0
        tail = (f"Host cache (cache_bytes={cache!r}): each sample's encoded bytes and record, read once, "
                "then handed to the workers in the batch's slot." if cache else
                "No host cache (cache_bytes=0): every epoch reads every sample.")
        return head + "\n" + "\n".join(explain_samples(dataset)) + "\n" + tail
    if not isinstance(dataset, ImageSource):
        return head
    return head + "\n" + explain_dataset(dataset)


def explain_dataset(dataset: ImageSource | DetectionSource) -> str:
    """A gpufeed image dataset's transform: where each op runs (a detection dataset: what runs
    per sample, or its untranslated ``transforms``)."""
    if isinstance(dataset, DetectionSource):
        if isinstance(dataset.transforms, DetectionPipeline):
            return f"{type(dataset).__name__}: " + "\n".join(explain_samples(dataset))
        if dataset.transforms is None:
            return (f"{type(dataset).__name__}: no transforms: __getitem__ returns PIL images "
                    "(the generic path)")
        _, report = translate_detection(dataset.transforms)
        return f"{type(dataset).__name__}'s transforms: {report}"
    text = explain_transform(dataset.transform)
    return f"{type(dataset).__name__}'s transform: " + text.replace("\n", "\n  ")
