"""GPU tests run only where CUDA is; elsewhere every test here is skipped with the reason."""

from __future__ import annotations

import pytest
import torch

CUDA_REASON = (
    f"needs CUDA: torch {torch.__version__} (CUDA {torch.version.cuda}) reports "
    f"torch.cuda.is_available() == {torch.cuda.is_available()}"
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=CUDA_REASON)
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/") and "cpu_ok" not in item.keywords:
            item.add_marker(skip)
