"""The public surface: __all__ is sorted and complete, and importing gpufeed starts nothing."""

from __future__ import annotations

import inspect

import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed import FastLoader


def test_all_is_sorted_and_complete():
    assert gpufeed.__all__ == sorted(gpufeed.__all__)
    public = {n for n, v in vars(gpufeed).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert public == set(gpufeed.__all__)


# The checks of a plain ``import gpufeed`` in a fresh interpreter (tests/_imports.py): what it
# started, captured right after the import, then the lazily imported modules' first use.


def test_fastloader_is_a_dataloader_with_its_signature_plus_keyword_options():
    loader = FastLoader(torch.utils.data.TensorDataset(torch.arange(4)))
    assert isinstance(loader, DataLoader)
    ours = inspect.signature(FastLoader).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    for name, param in theirs.items():
        if name == "self":
            continue
        assert ours[name].default == param.default and ours[name].kind == param.kind
    extra = [p for n, p in ours.items() if n not in theirs]
    assert extra and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)
    assert FastLoader[int] is not None  # stays generic for type checkers


def test_image_sources_are_exported_from_gpufeed_and_gpufeed_sources():
    import gpufeed.sources

    for name in ("ImageDataset", "ImageFolder", "LMDBDataset", "TarShards"):
        cls = getattr(gpufeed, name)
        assert cls is getattr(gpufeed.sources, name) and issubclass(cls, gpufeed.ImageSource)
    assert gpufeed.sources.__all__ == sorted(gpufeed.sources.__all__)
