"""Shared fixtures for the pytest-benchmark suites: loader classes and the environment record."""

from __future__ import annotations

from typing import Any

import pytest

from gpufeed.compare._environment import describe_environment


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """Stores gpufeed's environment record (versions, CPU model, decode backend) with every run."""
    machine_info["gpufeed_environment"] = describe_environment()


def _fast_loader() -> type:
    try:
        from gpufeed import FastLoader
    except ImportError as exc:
        pytest.skip(f"gpufeed.FastLoader does not import yet: {exc}")
    return FastLoader


def _data_loader() -> type:
    from torch.utils.data import DataLoader

    return DataLoader


@pytest.fixture(params=["DataLoader", "FastLoader"])
def loader_cls(request: pytest.FixtureRequest) -> type:
    """Each loader class in turn: torch's DataLoader (the baseline), then gpufeed's FastLoader."""
    return _data_loader() if request.param == "DataLoader" else _fast_loader()
