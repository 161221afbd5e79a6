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
    assert loader.stats()["pinned_bytes"] == 0  # nothing page-locked without CUDA


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


@pytest.fixture
def nvml_sees_two_gpus(monkeypatch):
    """A host where NVML counts 2 GPUs and every CUDA runtime entry point raises (and is logged)."""
    called: list[str] = []

    def trap(name):
        def runtime_call(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} was called: it initialises the CUDA runtime")
        return runtime_call

    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", trap("cudaGetDeviceCount"), raising=False)
    monkeypatch.setattr(torch.cuda, "_lazy_init", trap("torch.cuda._lazy_init"))
    monkeypatch.setattr(torch.cuda, "current_device", trap("torch.cuda.current_device"))
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    return called


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_building_a_cuda_loader_calls_no_cuda_runtime_function(nvml_sees_two_gpus, device):
    loader = FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), batch_size=3, device=device, num_workers=2)
    assert nvml_sees_two_gpus == [] and loader.device == device


def test_a_cuda_index_past_the_nvml_count_fails_at_construction(nvml_sees_two_gpus):
    with pytest.raises(ValueError, match=r"device='cuda:2'.*2 CUDA device"):
        FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), device="cuda:2")
    assert nvml_sees_two_gpus == []


def test_cuda_without_an_index_is_the_current_device_when_resolved(nvml_sees_two_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # at the first iteration
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert nvml_sees_two_gpus == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_without_cuda_a_cuda_loader_fails_at_construction(device):
    with pytest.raises(BackendUnavailableError, match="needs CUDA.*Fix:"):
        FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), device=device)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_building_a_cuda_image_batcher_calls_no_cuda_runtime_function(nvml_sees_two_gpus, device):
    """Its workers start at construction (fork here): no CUDA context may exist before them."""
    from gpufeed.serve import ImageBatcher

    batcher = ImageBatcher(lambda x: x, device=device, num_workers=1, mp_context="fork")
    try:
        assert nvml_sees_two_gpus == [] and batcher.device == device
    finally:
        batcher.close()
    assert nvml_sees_two_gpus == []
