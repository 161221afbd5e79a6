"""torchvision v2's ``fill`` resolved per type NAME (``gpufeed.image.detection._fills``), as
the crops, the affine ops and the references' ``PadIfSmaller`` use it: a dict's entry by its
key's class name, else "others" (a ``defaultdict``'s default is not used), else None; values
converted as torchvision's ``_convert_fill_arg``; fills it refuses are TypeErrors."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from gpufeed.image.detection._crops import Pad
from gpufeed.image.detection._fills import check_fill, fill_for, setup_fill
from gpufeed.image.detection._refs import PadIfSmaller
from gpufeed.image.detection._sample import Mask, Sample


class _Mask:  # stands for tv_tensors.Mask: resolved by its name
    pass


_Mask.__name__ = "Mask"


class _Image:
    pass


_Image.__name__ = "Image"


def test_fill_for_resolves_by_class_name():
    fill = {_Mask: 255, _Image: (1, 2, 3), "others": 7}
    assert fill_for(fill, "Mask") == 255
    assert fill_for(fill, "Image") == (1.0, 2.0, 3.0)
    assert fill_for(fill, "Tensor") == 7
    assert fill_for({_Mask: 1}, "Image") is None
    assert fill_for((4, 5, 6), "Image") == (4.0, 5.0, 6.0)
    assert fill_for(3, "Mask") == 3
    assert fill_for(np.uint8(3), "Mask") == 3.0


def test_setup_fill_keys_by_name_and_fill_for_reads_it():
    fills = setup_fill({_Mask: 255, "Image": (1, 2, 3), "others": 4})
    assert fills == {"Mask": 255, "Image": (1.0, 2.0, 3.0), "others": 4}
    assert fill_for(fills, "KeyPoints") == 4
    assert fill_for(setup_fill(None), "Image") is None
    assert setup_fill(5) == {"others": 5}


def test_a_defaultdict_default_is_not_used():
    fill = defaultdict(lambda: 9, {_Mask: 1})
    assert fill_for(fill, "Image") is None
    assert fill_for(defaultdict(lambda: 9, {"others": 2}), "Image") == 2


@pytest.mark.parametrize("bad", ["white", [], [1, "a"], {_Mask: "x"}, True])
def test_refused_fills_are_type_errors(bad):
    with pytest.raises(TypeError, match="fill"):
        setup_fill(bad)
    with pytest.raises(TypeError, match="fill"):
        Pad(2, fill=bad)
    with pytest.raises(TypeError, match="fill"):
        PadIfSmaller(8, fill=bad)


def test_check_fill_keeps_values_and_names_keys():
    assert check_fill({_Mask: 255, "others": [1, 2, 3]}) == {"Mask": 255, "others": [1, 2, 3]}
    assert check_fill((1, 2, 3)) == (1, 2, 3)


def test_ops_pad_image_and_mask_with_their_own_fill():
    img = np.zeros((4, 6, 3), np.uint8)
    sample = Sample(img, Mask(data=np.ones((4, 6), np.uint8)))
    fill = {_Mask: 255, "others": 9}
    for op in (Pad([0, 0, 2, 2], fill=fill), PadIfSmaller(8, fill=fill)):
        out = op(sample, np.random.default_rng(0))
        assert (out.image[4:] == 9).all() and (out.image[:, 6:] == 9).all()
        assert (out.target.dense()[4:] == 255).all() and (out.target.dense()[:4, :6] == 1).all()
