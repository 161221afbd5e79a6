"""gpufeed's augmentations: torchvision's and timm's ops on the rows of a batch, in the workers.

Pass them to a fast-path transform: ``RandomResizedCrop(224, ops=(TrivialAugmentWide(),),
float_ops=(RandomErasing(0.25),))``. ``ops`` run in order on the uint8 rows after decode and
geometry; ``float_ops`` on the normalized float rows. Random parameters depend only on
(seed, epoch, sample index): the same batches for any ``num_workers``. Pixels are computed as
torchvision and timm compute them on PIL images (docs/design/augment.md).
"""

from gpufeed.image.augment._augmix import AugMix, TimmAugMix
from gpufeed.image.augment._base import FloatRowOp, RowOp, RowOps, row_rng
from gpufeed.image.augment._compose import RandomApply, RandomChoice, RandomOrder
from gpufeed.image.augment._erasing import RandomErasing, TimmRandomErasing
from gpufeed.image.augment._ops import (
    ColorJitter,
    GaussianBlur,
    RandomAdjustSharpness,
    RandomAffine,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomInvert,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
    RandomVerticalFlip,
)
from gpufeed.image.augment._policies import AutoAugment, RandAugment, TrivialAugmentWide
from gpufeed.image.augment._timm_auto import TimmAutoAugment
from gpufeed.image.augment._timm_rand import TimmRandAugment

__all__ = [
    "AugMix",
    "AutoAugment",
    "ColorJitter",
    "FloatRowOp",
    "GaussianBlur",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomOrder",
    "RandomPosterize",
    "RandomRotation",
    "RandomSolarize",
    "RandomVerticalFlip",
    "RowOp",
    "RowOps",
    "TimmAugMix",
    "TimmAutoAugment",
    "TimmRandAugment",
    "TimmRandomErasing",
    "TrivialAugmentWide",
    "row_rng",
]
