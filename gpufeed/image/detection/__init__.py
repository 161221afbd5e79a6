"""Detection and segmentation on the image fast path: joint transforms that move boxes, masks
and keypoints with the image, with torchvision v2's semantics (``docs/design/detection.md``).

The modules are private; this package's names are the public ones.
"""

from gpufeed.image.detection._as_given import AsGiven
from gpufeed.image.detection._pipeline import DetectionPipeline
from gpufeed.image.detection._sample import Boxes, JointOp, KeyPoints, Mask, Sample
from gpufeed.image.detection._translate import translate_detection

__all__ = ["AsGiven", "Boxes", "DetectionPipeline", "JointOp", "KeyPoints", "Mask", "Sample",
           "translate_detection"]
