"""torchvision v2 detection/segmentation pipelines (given as ``transforms=``, image and target
together) translated op by op into a :class:`DetectionPipeline`."""

from __future__ import annotations

from typing import Any

from gpufeed.image.detection._pipeline import DetectionPipeline

__all__ = ["translate_detection"]


def translate_detection(pipeline: Any) -> tuple[DetectionPipeline | None, str]:
    """(the translation, or None when the pipeline must run as given on PIL images; a one-line
    report of where each op runs)."""
    return None, "translation of detection pipelines is not built yet"
