"""`gpufeed bench --dtype/--channels-last/--no-reference`: one FastLoader per output format,
each compared with NCHW float32, in one alternating run."""

from __future__ import annotations

import pytest
import torch

from gpufeed.cli.bench import outputs_of
from gpufeed.compare._images import FAST_NAME, LAYOUT_REFERENCE, Output, loader_factories


@pytest.fixture(scope="module")
def folder(image_folder):
    return image_folder(num_classes=2, per_class=4, size=(120, 150), seed=3)


def test_outputs_are_every_combination_with_the_reference_first():
    assert outputs_of(["uint8"], "off") == [Output()]
    both = outputs_of(["uint8", "float32", "float16", "bfloat16"], "both")
    assert both[0] == LAYOUT_REFERENCE and len(both) == len(set(both)) == 8
    assert outputs_of(["float16"], "on") == [LAYOUT_REFERENCE, Output("float16", True)]
    assert Output().name == FAST_NAME
    assert Output("bfloat16", True).name == "FastLoader channels_last bfloat16"
    with pytest.raises(ValueError, match="`dtype`"):
        Output("float64")


def test_each_output_loader_yields_its_format(folder):
    outputs = outputs_of(["uint8", "float16"], "both")
    factories = loader_factories(folder, "eval", batch_size=4, num_workers=0, include=[FAST_NAME],
                                 outputs=outputs, size=64, resize=72)
    assert list(factories) == [o.name for o in outputs]
    for output in outputs:
        images, _ = next(iter(factories[output.name]()))
        assert images.shape == (4, 3, 64, 64)
        assert images.dtype == {"uint8": torch.uint8, "float32": torch.float32,
                                "float16": torch.float16}[output.dtype]
        fmt = torch.channels_last if output.channels_last else torch.contiguous_format
        assert images.is_contiguous(memory_format=fmt)


def test_touch_pages_maps_channels_last_batches_like_nchw_ones():
    from gpufeed.compare._compare import touch_pages

    nchw = torch.zeros((4, 3, 64, 64), dtype=torch.float16)
    cl = nchw.contiguous(memory_format=torch.channels_last)
    assert touch_pages((cl,)) == touch_pages((nchw,)) == nchw.numel() * 2
