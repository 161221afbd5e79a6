"""device='cuda' on a machine without CUDA, with worker processes: the construction error."""

from __future__ import annotations

import pytest
import torch

from gpufeed import BackendUnavailableError, FastLoader


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
def test_cuda_device_without_cuda_fails_at_construction_naming_what_is_missing():
    with pytest.raises(BackendUnavailableError) as info:
        FastLoader(torch.utils.data.TensorDataset(torch.arange(6)), device="cuda", num_workers=2)
    msg = str(info.value)
    assert "torch.cuda.device_count() is 0" in msg and torch.__version__ in msg and "Fix:" in msg
