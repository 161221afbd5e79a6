"""The pipelines people copy translate like the pipelines they wrap: torchvision's reference
presets (``ClassificationPresetTrain`` / ``Eval``, the pipeline in ``.transforms``) and
open_clip's ``image_transform`` (``_convert_to_rgb``, a no-op on gpufeed's RGB decode).

Real torchvision (``make test`` runs this folder in ``.venv-tv``); the presets and open_clip's
transform are re-created in tests/torchvision/_copied.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

import torchvision.transforms as T  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed import FastLoader, ImageFolder, TorchvisionPipeline  # noqa: E402
from tests.torchvision._copied import (  # noqa: E402
    ClassificationPresetEval,
    ClassificationPresetTrain,
    _convert_to_rgb,
    image_transform,
    image_transform_later,
)
from tests.torchvision._folder import make_folder, mean_abs_levels  # noqa: E402

pytestmark = pytest.mark.timeout(120)

BICUBIC = T.InterpolationMode.BICUBIC
PRESETS = {
    "train-v1": lambda: ClassificationPresetTrain(crop_size=176),
    "train-v2": lambda: ClassificationPresetTrain(crop_size=176, use_v2=True),
    "train-v2-tensor": lambda: ClassificationPresetTrain(crop_size=176, use_v2=True, backend="tensor"),
    "train-ta-erase": lambda: ClassificationPresetTrain(crop_size=176, auto_augment_policy="ta_wide",
                                                        random_erase_prob=0.1, use_v2=True),
    "train-bicubic": lambda: ClassificationPresetTrain(crop_size=176, interpolation=BICUBIC),
    "eval-v1": lambda: ClassificationPresetEval(crop_size=224),
    "eval-v2": lambda: ClassificationPresetEval(crop_size=224, resize_size=232, use_v2=True),
    "eval-v2-tensor": lambda: ClassificationPresetEval(crop_size=224, use_v2=True, backend="tensor"),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("tvcopied"))


def same_translation(a: TorchvisionPipeline, b: TorchvisionPipeline) -> None:
    """``a`` and ``b`` are the same translation, op for op."""
    assert a.routes == b.routes
    assert repr(a.geometry) == repr(b.geometry)
    assert (a.output, a.dtype, a.normalize, a.output_size) == (b.output, b.dtype, b.normalize, b.output_size)
    assert [op.name for op in a.ops] == [op.name for op in b.ops]
    assert [op.name for op in a.float_ops] == [op.name for op in b.float_ops]


def fast_labels(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_reference_preset_translates_op_for_op_as_its_pipeline(root, name):
    preset = PRESETS[name]()
    assert gpufeed.image.is_torchvision(preset)
    ours = gpufeed.from_torchvision(preset)
    same_translation(ours, gpufeed.from_torchvision(preset.transforms))
    assert ours.source.startswith(f"{type(preset).__name__} of ")
    text = gpufeed.explain(preset)
    assert text == gpufeed.explain(preset.transforms)
    assert text.startswith("torchvision pipeline -> gpufeed fast path"), text
    assert len(fast_labels(text)) == len(preset.transforms.transforms)
    assert set(fast_labels(text)) == {"fast"}, text  # every op, ToPureTensor too: nothing per row
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        ds = ImageFolder(root, transform=preset)
        loader = FastLoader(ds, batch_size=4, num_workers=0, seed=3)
        images, _ = next(iter(loader))
    assert isinstance(ds.transform, TorchvisionPipeline) and loader.stats()["path"] == "image"
    plain = ImageFolder(root, transform=preset.transforms)
    want, _ = next(iter(FastLoader(plain, batch_size=4, num_workers=0, seed=3)))
    torch.testing.assert_close(images, want, rtol=0, atol=0)
    assert gpufeed.explain(loader).splitlines()[1] == "ImageFolder's transform: " + text.splitlines()[0]


def test_an_eval_preset_gives_torchvisions_values(root):
    preset = ClassificationPresetEval(crop_size=224, use_v2=True)
    ours = ImageFolder(root, transform=preset)
    theirs = tv.datasets.ImageFolder(str(root), transform=preset)
    for i in (0, 3, 7):
        (x, _), (ref, _) = ours[i], theirs[i]
        assert type(x) is type(ref) is torch.Tensor and x.shape == ref.shape == (3, 224, 224)
        assert mean_abs_levels(x, ref) <= 3.0, i


def test_a_preset_of_untranslatable_ops_runs_as_given_and_says_why(root):
    preset = ClassificationPresetEval(crop_size=224, interpolation=T.InterpolationMode.NEAREST)
    assert "interpolation nearest" in gpufeed.explain(preset)
    with pytest.warns(gpufeed.GpufeedWarning, match="interpolation nearest"):
        ds = ImageFolder(root, transform=preset)
    assert ds.transform is preset  # as given, on PIL images as stored (torchvision's rule)
    theirs = tv.datasets.ImageFolder(str(root), transform=preset)
    torch.testing.assert_close(ds[0][0], theirs[0][0], rtol=0, atol=0)


def test_a_class_named_like_a_preset_without_a_pipeline_is_a_user_callable():
    class ClassificationPresetEval:  # noqa: N801 - the name is the point
        transforms = None

        def __call__(self, img):
            return img

    assert not gpufeed.image.is_torchvision(ClassificationPresetEval())
    assert "callable gpufeed cannot look into" in gpufeed.explain(ClassificationPresetEval())


OPEN_CLIP = {
    "eval": lambda: image_transform(224, is_train=False),
    "train": lambda: image_transform(224, is_train=True),
    "rgb-first": lambda: T.Compose([_convert_to_rgb, T.Resize(224, interpolation=BICUBIC),
                                    T.CenterCrop(224), T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)]),
    "later-eval": lambda: image_transform_later(224, is_train=False),
    "later-train": lambda: image_transform_later(224, is_train=True),
}


def without_rgb_conversion(pipeline):
    """The same pipeline without open_clip's conversion to RGB, with torchvision's ToTensor."""
    ops = []
    for op in pipeline.transforms:
        if op is _convert_to_rgb or type(op).__name__ == "MaybeConvertMode":
            continue
        ops.append(T.ToTensor() if type(op).__name__ == "MaybeToTensor" else op)
    return T.Compose(ops)


@pytest.mark.parametrize("name", list(OPEN_CLIP))
def test_open_clip_s_transform_translates_as_the_pipeline_without_its_rgb_conversion(root, name):
    pipeline = OPEN_CLIP[name]()
    ours = gpufeed.from_torchvision(pipeline)
    plain = gpufeed.from_torchvision(without_rgb_conversion(pipeline))
    convert = [r for r in ours.routes if "convert" in r.op.lower()]
    assert len(convert) == 1 and convert[0].fast and convert[0].note == "no-op: gpufeed decodes every image to RGB"
    assert convert[0].op in ("_convert_to_rgb", "MaybeConvertMode()")  # its name, no address
    rest = tuple(r for r in ours.routes if r is not convert[0])
    assert [(r.op.replace("MaybeToTensor", "ToTensor"), r.fast, r.note, r.where) for r in rest] == \
        [(r.op, r.fast, r.note, r.where) for r in plain.routes]
    assert repr(ours.geometry) == repr(plain.geometry) and ours.normalize == plain.normalize
    assert ours.interpolation == "bicubic"
    text = gpufeed.explain(pipeline)
    assert text.startswith("torchvision pipeline -> gpufeed fast path") and set(fast_labels(text)) == {"fast"}
    assert f"fast    {convert[0].op}: no-op: gpufeed decodes every image to RGB" in text, text
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        ds = ImageFolder(root, transform=pipeline)
        images, _ = next(iter(FastLoader(ds, batch_size=3, num_workers=0, seed=2)))
    want, _ = next(iter(FastLoader(ImageFolder(root, transform=without_rgb_conversion(pipeline)),
                                   batch_size=3, num_workers=0, seed=2)))
    torch.testing.assert_close(images, want, rtol=0, atol=0)


def test_open_clip_s_eval_transform_gives_its_values(root):
    pipeline = image_transform(224, is_train=False)
    ours = ImageFolder(root, transform=pipeline)
    theirs = tv.datasets.ImageFolder(str(root), transform=pipeline)
    for i in (0, 3, 7):
        x, ref = ours[i][0], theirs[i][0]
        assert x.shape == ref.shape == (3, 224, 224)
        # bicubic: gpufeed's INTER_CUBIC against PIL's
        assert mean_abs_levels(x, ref) <= 3.0, i


def test_explain_shows_every_parameter_of_an_op():
    text = gpufeed.explain(image_transform(224, is_train=True))
    assert "RandomResizedCrop(size=(224, 224), scale=(0.9, 1.0), ratio=(0.75, 1.3333), " \
           "interpolation=bicubic, antialias=True)" in text, text
    assert "..." not in text


def test_explain_never_cuts_a_torchvision_or_timm_op():
    from timm.data import create_transform

    text = gpufeed.explain(create_transform(224, is_training=True, auto_augment="original"))
    line = next(line for line in text.splitlines() if "AutoAugment(policy=" in line)
    assert len(line) > 2000 and "..." not in line  # timm's whole policy
