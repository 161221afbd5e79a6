"""The JSON form of a stateful sampler's state (gpufeed/_resume/sampler_state.py): what a sampler's
state_dict() holds comes back as it was, through json.dumps/loads."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from gpufeed._resume.sampler_state import from_json, to_json


def roundtrip(value):
    return from_json(json.loads(json.dumps(to_json(value, "state"))))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32, torch.float16, torch.bfloat16, torch.bool])
def test_tensors_keep_dtype_shape_and_bytes(dtype: torch.dtype) -> None:
    t = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    back = roundtrip({"t": t, "scalar": t[1, 2], "generator": torch.Generator().manual_seed(4).get_state()})
    assert back["t"].dtype == dtype and back["t"].shape == (3, 4) and torch.equal(back["t"], t)
    assert back["scalar"].shape == () and torch.equal(back["scalar"], t[1, 2])
    g = torch.Generator()
    g.set_state(back["generator"])  # a generator state loads as such
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(4)))


def test_arrays_bytes_tuples_and_non_string_keys() -> None:
    state = {"a": np.arange(6, dtype=np.uint32).reshape(2, 3), "b": b"\x00\xff", "t": (1, (2, "x"), None),
             "ints": {3: "three", (1, 2): [1.5, True]}, "n": np.int64(7), "py_random": random.Random(3).getstate()}
    back = roundtrip(state)
    assert back["a"].dtype == np.uint32 and np.array_equal(back["a"], state["a"])
    assert back["b"] == b"\x00\xff" and back["t"] == (1, (2, "x"), None)
    assert back["ints"] == {3: "three", (1, 2): [1.5, True]} and back["n"] == 7
    r = random.Random()
    r.setstate(back["py_random"])  # python's random wants tuples: they come back as tuples
    assert r.random() == random.Random(3).random()


def test_an_unknown_type_names_where_it_is() -> None:
    with pytest.raises(TypeError, match=r"state\['inner'\]\[1\] holds a object"):
        to_json({"inner": [1, object()]}, "state")
