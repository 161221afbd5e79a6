"""A worker's random states (gpufeed/_resume/rng.py): what changed is sent, and it restores exactly."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from gpufeed._resume.rng import RngTracker, decode, encode


@pytest.fixture(autouse=True)
def _keep_global_generators():
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    yield
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])
    np.random.set_state(saved[2])


def draws() -> tuple[float, float, float, float, float]:
    return (float(torch.rand(())), random.random(), random.gauss(0, 1), float(np.random.rand()),
            float(np.random.randn()))


def test_nothing_is_sent_until_a_generator_moves() -> None:
    tracker = RngTracker()
    assert tracker.changes() is None
    torch.rand(2)
    t, r, n = tracker.changes()
    assert t is not None and r is None and n is None
    assert tracker.changes() is None
    random.random()
    assert tracker.changes()[1] is not None
    np.random.rand()
    assert tracker.changes()[2] is not None


def test_consuming_a_cached_gaussian_is_a_change() -> None:
    """gauss()/randn() make two values and cache one: the next call moves no MT word."""
    tracker = RngTracker()
    random.gauss(0, 1)
    np.random.randn()
    assert tracker.changes() is not None
    random.gauss(0, 1)
    assert tracker.changes() is not None
    np.random.randn()
    assert tracker.changes() is not None
    assert tracker.changes() is None


def test_restore_through_json_gives_the_same_draws() -> None:
    tracker = RngTracker()
    draws()
    state = tracker.changes()
    expected = [draws() for _ in range(3)]
    back = decode(json.loads(json.dumps(encode(state))), "test")
    draws()
    tracker.restore(back)
    assert [draws() for _ in range(3)] == expected
    # None components: as after set-up
    tracker.restore((None, None, None))
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    fresh = draws()
    tracker.restore((None, None, None))
    assert draws() == fresh
    assert encode((None, None, None)) is None


def test_malformed_state_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"where is not a random state"):
        decode({"numpy": ["AAAA", 1]}, "where")
    with pytest.raises(ValueError, match="keys torch/random/numpy"):
        decode({"cuda": "x"}, "where")


@pytest.mark.parametrize("in_place", [True, False])
def test_in_place_reads_and_their_fallback(in_place: bool) -> None:
    """The in-place reads (random's and numpy's words, numpy's cached gaussian) are found on this
    CPython/numpy; without them getstate()/get_state() give the same answers."""
    tracker = RngTracker()
    assert (tracker._random_read is not None) and (tracker._numpy_read is not None)
    if not in_place:
        tracker._random_read = tracker._numpy_read = None
        tracker._now = tracker._read()
    draws()
    state = tracker.changes()
    assert all(part is not None for part in state)
    expected = [draws() for _ in range(2)]
    tracker.restore(state)  # the forms the worker sends, without JSON
    assert [draws() for _ in range(2)] == expected
    tracker.restore(state)
    np.random.randn()  # makes two, caches one
    tracker.changes()
    np.random.randn()  # takes the cached one: no MT word moves
    assert tracker.changes() is not None
