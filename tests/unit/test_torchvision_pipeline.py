"""TorchvisionPipeline without torchvision: the translation's target is a gpufeed transform, so
its batch stage, its errors and its EXIF rule are tested here with one built directly; the
translation from real torchvision objects is tested in tests/torchvision (in .venv-tv)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import gpufeed
from gpufeed import (
    FastLoader,
    ImageDataset,
    ImageFolder,
    RandomResizedCrop,
    ResizeCenterCrop,
    TorchvisionPipeline,
)
from gpufeed.synth import encode, photo_like, with_exif_orientation

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def pipeline(geometry=None, *, normalize=(MEAN, STD), dtype=torch.float32, output="float"):
    return TorchvisionPipeline(geometry or ResizeCenterCrop(32, 40), output=output, dtype=dtype,
                               normalize=normalize, routes=(), source="built in a test")


@pytest.fixture(scope="module")
def root(image_folder):
    return image_folder(num_classes=2, per_class=4, size=((50, 90), (50, 90)), seed=4)


def test_normalize_twice_and_uint8_against_a_float_pipeline_are_errors(root):
    ds = ImageFolder(root, transform=pipeline())
    with pytest.raises(ValueError, match="normalized twice") as info:
        FastLoader(ds, batch_size=2, normalize=(MEAN, STD))
    assert "Drop one" in str(info.value)
    with pytest.raises(ValueError, match="dtype=torch.uint8 on the loader contradicts"):
        FastLoader(ds, batch_size=2, dtype=torch.uint8)
    half, _ = next(iter(FastLoader(ds, batch_size=2, dtype=torch.float16)))
    assert half.dtype == torch.float16
    plain = ImageFolder(root, transform=pipeline(normalize=None))
    images, _ = next(iter(FastLoader(plain, batch_size=2, normalize=(MEAN, STD))))
    torch.testing.assert_close(images[0], ds[0][0], rtol=0, atol=1e-5)


def test_uint8_pipeline_gives_uint8_and_takes_the_loader_s_normalize(root):
    ds = ImageFolder(root, transform=pipeline(normalize=None, dtype=torch.uint8, output="uint8"))
    assert torch.equal(ds[1][0], ImageFolder(root, transform=ResizeCenterCrop(32, 40))[1][0])
    images, _ = next(iter(FastLoader(ds, batch_size=2)))
    assert images.dtype == torch.uint8 and torch.equal(images[1], ds[1][0])
    images, _ = next(iter(FastLoader(ds, batch_size=2, normalize=(MEAN, STD))))
    assert images.dtype == torch.float32
    torch.testing.assert_close(images[1], ImageFolder(root, transform=pipeline())[1][0],
                               rtol=0, atol=1e-5)


def test_exif_orientation_is_ignored_as_torchvision_does():
    plain = encode(photo_like(60, 90, seed=2))
    rotated = with_exif_orientation(plain, 6)
    items = [(plain, 0), (rotated, 0)]
    ours = ImageDataset(items, transform=pipeline(normalize=None, dtype=torch.uint8, output="uint8"))
    own = ImageDataset(items, transform=ResizeCenterCrop(32, 40))
    assert torch.equal(ours[0][0], ours[1][0])  # the tag changes nothing: used as stored
    assert torch.equal(ours[0][0], own[0][0])
    assert not torch.equal(own[0][0], own[1][0])  # gpufeed's own transform applies it


def test_random_params_are_the_geometry_s_and_pickle_round_trips():
    pipe = pipeline(RandomResizedCrop(24, scale=(0.3, 0.9)))
    assert pipe.params(1, 2, 3, 80, 60) == RandomResizedCrop(24, scale=(0.3, 0.9)).params(1, 2, 3, 80, 60)
    assert not pipe.deterministic and pipe.output_size == (24, 24)
    again = pickle.loads(pickle.dumps(pipe))
    data = encode(photo_like(80, 60, seed=1))
    out_a, out_b = np.empty((3, 24, 24), np.uint8), np.empty((3, 24, 24), np.uint8)
    pipe.apply(data, index=5, epoch=1, seed=9, out=out_a)
    again.apply(data, index=5, epoch=1, seed=9, out=out_b)
    assert np.array_equal(out_a, out_b)
    with pytest.raises(ValueError, match="params\\(\\) needs a RandomResizedCrop pipeline"):
        pipeline().params(0, 0, 0, 80, 60)


def test_explain_and_from_torchvision_without_torchvision():
    assert gpufeed.explain(ResizeCenterCrop(224, 256)).startswith("gpufeed transform ResizeCenterCrop: fast path")
    assert gpufeed.explain(None).startswith("no transform")
    assert "callable gpufeed cannot look into" in gpufeed.explain(lambda image: image)
    with pytest.raises(TypeError, match="takes a torchvision transform") as info:
        gpufeed.from_torchvision(ResizeCenterCrop(224, 256))
    assert "Found: ResizeCenterCrop" in str(info.value)
    with pytest.raises(ValueError, match="`output` must be"):
        pipeline(output="pil")
    with pytest.raises(ValueError, match="`normalize` needs a float `dtype`"):
        pipeline(dtype=torch.uint8)
    with pytest.raises(TypeError, match="`geometry` must be a gpufeed ResizeCenterCrop"):
        TorchvisionPipeline(lambda image: image, output="float", dtype=torch.float32,
                            normalize=None, routes=(), source="")


class LongRepr:
    """A callable whose repr is as long as a torchvision op's with every parameter."""

    def __init__(self, width: int) -> None:  # the length of the repr
        self.width = width

    def __call__(self, image):
        return image

    def __repr__(self) -> str:
        return ("RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), "
                "interpolation=InterpolationMode.BICUBIC, antialias=True" + "," * (self.width - 144) + ")")


def test_explain_shows_every_parameter_of_an_op():
    text = gpufeed.explain(LongRepr(153))
    assert "interpolation=InterpolationMode.BICUBIC, antialias=True,,,,,,,,,)" in text, text
    assert "..." not in text
    cut = gpufeed.explain(LongRepr(5000))  # a repr holding data is still cut, at 500 characters
    assert "..." in cut and len(cut) < 800
