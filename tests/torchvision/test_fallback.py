"""What gpufeed does not translate runs as given; explain() and the log say why; clear errors.

Real torchvision (``make test`` runs this folder in ``.venv-tv``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed import FastLoader, ImageFolder, TorchvisionPipeline  # noqa: E402
from tests.torchvision._folder import EXIF_INDEX, MEAN, STD, make_folder, mean_abs_levels  # noqa: E402

pytestmark = pytest.mark.timeout(120)

NEAREST = T.InterpolationMode.NEAREST
# (pipeline, the op's text in explain, words of the reason)
UNTRANSLATABLE = [
    (T.Compose([T.Resize(256, interpolation=NEAREST), T.CenterCrop(224), T.ToTensor()]),
     "Resize(size=256, interpolation=nearest", "interpolation nearest"),
    (T.Compose([T.Resize((256, 256)), T.CenterCrop(224), T.ToTensor()]),
     "CenterCrop(size=(224, 224))", "a second crop/resize"),
    (T.Compose([T.Resize(256, max_size=300), T.CenterCrop(224), T.ToTensor()]),
     "Resize(size=256", "max_size=300"),
    (V.Compose([V.ToImage(), V.Resize(256, antialias=False), V.CenterCrop(224)]),
     "Resize(size=[256]", "antialias=False"),
    (T.Compose([T.RandomResizedCrop(224), T.ToPILImage(), T.ToTensor()]),
     "ToPILImage()", "ToPILImage needs a PIL image"),
    (V.Compose([V.RandomResizedCrop(224), V.ToImage(), V.ToDtype(torch.float32)]),
     "ToDtype(scale=False)", "0-255 values"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("tvfallback"))


def test_explain_translated_pipeline_lists_every_op_on_the_fast_path():
    text = gpufeed.explain(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                      T.ToTensor(), T.Normalize(MEAN, STD)]))
    assert isinstance(text, str)
    lines = text.splitlines()
    assert lines[0].startswith("torchvision pipeline -> gpufeed fast path (RandomResizedCrop to "
                               "224x224, torch.float32, normalized")
    assert "EXIF orientation ignored" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["fast"] * 4
    assert "RandomHorizontalFlip(p=0.5): flip drawn from (seed, epoch, index)" in text
    assert "on the whole batch (on the GPU with device=)" in lines[4]
    assert gpufeed.explain(gpufeed.from_torchvision(T.Compose([T.RandomResizedCrop(224),
                                                               T.ToTensor()]))).startswith(
        "torchvision pipeline -> gpufeed fast path")


@pytest.mark.parametrize("pipeline,op,why", UNTRANSLATABLE,
                         ids=["nearest", "resize-hw-then-crop", "max_size", "antialias-false",
                              "to-pil-image", "todtype-no-scale"])
def test_untranslatable_parameters_run_the_pipeline_as_given(root, pipeline, op, why):
    text = gpufeed.explain(pipeline)
    assert text.startswith("torchvision pipeline runs as given"), text
    labels = [line.split()[0] for line in text.splitlines()[1:]]
    assert set(labels) <= {"ok", "NO"} and "NO" in labels, text
    bad = [line for line in text.splitlines()[1:] if line.split()[0] == "NO"]
    assert any(op in line and why in line for line in bad), text
    with pytest.raises(ValueError, match="cannot translate this torchvision pipeline") as info:
        gpufeed.from_torchvision(pipeline)
    assert why in str(info.value)
    with pytest.warns(gpufeed.GpufeedWarning, match="leaves gpufeed's fast path"):
        ds = ImageFolder(root, transform=pipeline)
    assert ds.transform is pipeline  # kept as given: the callable path


@pytest.mark.filterwarnings("ignore::gpufeed.GpufeedWarning")
def test_fallback_gives_torchvisions_own_output_and_batches_it(root):
    pipeline = T.Compose([T.Resize(256, interpolation=NEAREST), T.CenterCrop(224), T.ToTensor(),
                          T.Normalize(MEAN, STD)])
    ours = ImageFolder(root, transform=pipeline)
    theirs = tv.datasets.ImageFolder(str(root), transform=pipeline)
    for i in (0, 3, EXIF_INDEX):  # the EXIF image is used as stored, as torchvision does
        assert mean_abs_levels(ours[i][0], theirs[i][0]) <= 1.0, i
    loader = FastLoader(ours, batch_size=4, num_workers=2)
    assert not loader._image_path
    with pytest.raises(ValueError, match="gpufeed.explain\\(dataset.transform\\) says where each op runs"):
        FastLoader(ours, batch_size=4, channels_last=True)
    images, labels = next(iter(loader))
    torch.testing.assert_close(images, torch.stack([ours[i][0] for i in range(4)]), rtol=0, atol=0)
    assert labels.tolist() == [ours[i][1] for i in range(4)]


def test_normalize_in_pipeline_and_on_loader_is_an_error(root):
    ds = ImageFolder(root, transform=T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                                                T.Normalize(MEAN, STD)]))
    with pytest.raises(ValueError, match="normalized twice") as info:
        FastLoader(ds, batch_size=4, num_workers=0, normalize=(MEAN, STD))
    assert "Normalize(mean=[0.485, 0.456, 0.406]" in str(info.value)
    with pytest.raises(ValueError, match="dtype=torch.uint8 on the loader contradicts"):
        FastLoader(ds, batch_size=4, num_workers=0, dtype=torch.uint8)
    # without Normalize in the pipeline, the loader's normalize applies
    plain = ImageFolder(root, transform=V.Compose([V.ToImage(), V.Resize(256), V.CenterCrop(224),
                                                   V.ToDtype(torch.float32, scale=True)]))
    images, _ = next(iter(FastLoader(plain, batch_size=2, num_workers=0, normalize=(MEAN, STD))))
    want = (plain[0][0] - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    torch.testing.assert_close(images[0], want.as_subclass(torch.Tensor), rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore::gpufeed.GpufeedWarning")
def test_one_info_line_when_the_dataset_is_built(root, caplog):
    caplog.set_level(logging.INFO, logger="gpufeed")
    ImageFolder(root, transform=T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()]))
    ImageFolder(root, transform=T.Compose([T.Resize(256), T.CenterCrop(224), T.Grayscale()]))
    records = [r.getMessage() for r in caplog.records if r.name == "gpufeed.sources._base"]
    assert len(records) == 2, records
    assert records[0].startswith("gpufeed: ImageFolder: torchvision pipeline -> gpufeed fast path")
    assert records[1].startswith("gpufeed: ImageFolder: torchvision pipeline runs as given")
    assert "Grayscale(num_output_channels=1) makes one-channel images" in records[1]


def test_a_loader_keeps_the_pipeline_as_given(root):
    pipeline = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])
    ds = ImageFolder(root, transform=pipeline, loader=tv.datasets.folder.default_loader)
    assert ds.transform is pipeline
    assert ds[0][0].shape == (3, 224, 224)


def test_from_torchvision_returns_a_transform_gpufeed_datasets_take(root):
    pipe = gpufeed.from_torchvision(V.Compose([V.RandomResizedCrop(160), V.PILToTensor()]))
    assert isinstance(pipe, TorchvisionPipeline) and pipe.output_size == (160, 160)
    assert pipe.dtype == torch.uint8 and pipe.normalize is None
    assert gpufeed.from_torchvision(pipe) is pipe
    ds = ImageFolder(root, transform=pipe)
    images, _ = next(iter(FastLoader(ds, batch_size=3, num_workers=0)))
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 160, 160)
    with pytest.raises(TypeError, match="from_torchvision\\(\\) takes a torchvision transform"):
        gpufeed.from_torchvision(lambda img: img)
