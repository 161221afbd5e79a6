"""The CPU side of the CUDA feed: device resolution, the error without CUDA, nested moves."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from gpufeed import BackendUnavailableError, FastLoader
from gpufeed.cuda._feed import map_tensors, resolve_device

Pair = namedtuple("Pair", "a b")


def test_cpu_or_none_device_means_no_cuda_feed():
    assert resolve_device(None) is None
    assert resolve_device("cpu") is None
    loader = FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), batch_size=3, device="cpu")
    assert [b[0].tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", 3.5])
def test_bad_device_values(bad):
    with pytest.raises((ValueError, BackendUnavailableError)):
        resolve_device(bad)


def test_prefetch_batches_validated():
    with pytest.raises(ValueError, match="prefetch_batches"):
        FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), prefetch_batches=0)


def test_map_tensors_keeps_structure():
    batch = {"x": torch.ones(2), "pair": Pair(torch.zeros(1), "s"), "list": [torch.ones(1), 3, b"b"], "t": (torch.ones(1),)}
    out = map_tensors(batch, lambda t: t + 1)
    assert out["x"].tolist() == [2.0, 2.0]
    assert isinstance(out["pair"], Pair) and out["pair"].a.tolist() == [1.0] and out["pair"].b == "s"
    assert out["list"][0].tolist() == [2.0] and out["list"][1:] == [3, b"b"]
    assert isinstance(out["t"], tuple) and out["t"][0].tolist() == [2.0]
