"""Augmentation ops and policies on the rows of a batch (public names: gpufeed.augment)."""
