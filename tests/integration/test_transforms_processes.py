"""Transforms in another process (spawn): the same crop parameters, the same plane-path pixels."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from gpufeed.image import RandomResizedCrop
from gpufeed.synth import photo_like
from tests.unit.test_transforms import (
    _params_in_child,
    _plane_path_in_child,
    jpeg,
    requires_turbojpeg,
)


@pytest.mark.timeout(60)  # a spawned pool
def test_params_identical_in_another_process(spawned):
    t = RandomResizedCrop(224)
    child = spawned.map(_params_in_child, [(11, 5, list(range(50)))])[0]
    assert child == [t.params(11, 5, i, 375, 500) for i in range(50)]


@pytest.fixture(scope="module")
def spawned():
    """One fresh interpreter ("spawn") for both "in another process" checks: each computes from
    its arguments alone, so neither can change what the other gets (~2 s each, mostly the
    interpreter importing torch)."""
    with mp.get_context("spawn").Pool(1) as pool:
        yield pool


@pytest.mark.timeout(60)  # a spawned pool
@requires_turbojpeg
def test_plane_path_identical_in_another_process(spawned):
    data = jpeg(photo_like(350, 400, seed=8), "440")
    child = spawned.map(_plane_path_in_child, [(data, list(range(6)))])[0]
    assert child == _plane_path_in_child((data, list(range(6))))
