"""Sources in torch's DataLoader worker processes."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed.image import RandomResizedCrop
from gpufeed.sources import (
    LMDBDataset,
)
from tests.unit.test_sources import packed  # noqa: F401 (fixtures, used by name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_workers_match_main_process(packed, context):
    ds = LMDBDataset(packed / "db.lmdb", transform=RandomResizedCrop(24, seed=3))
    ds[0]  # open the environment in the parent before workers start
    expect = [b for b in DataLoader(ds, batch_size=5)]
    got = [b for b in DataLoader(ds, batch_size=5, num_workers=2,
                                 multiprocessing_context=context)]
    assert len(got) == len(expect)
    for (xa, ya), (xb, yb) in zip(expect, got):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
