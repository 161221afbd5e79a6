"""Training recipes on the fast path: ops gpufeed does not know run as given on the rows as
tensors, only an op that needs a PIL image leaves the fast path (one GpufeedWarning naming it),
explain() says where every op runs, batches are the same for any num_workers.

Real torchvision and timm (``make test`` runs this folder in ``.venv-tv``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")
timm_data = pytest.importorskip("timm.data", reason="timm is not installed in this venv; "
                                "`make test` runs tests/torchvision in .venv-tv (timm>=1.0)")

import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed import FastLoader, ImageFolder, TorchvisionPipeline  # noqa: E402
from gpufeed.image._tensor_ops import seeded  # noqa: E402
from gpufeed.image.augment._base import ROW_STREAM, row_rng  # noqa: E402
from tests.torchvision._folder import MEAN, STD, make_folder  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Negate(torch.nn.Module):
    """A user's op on uint8 tensors that gpufeed does not know."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return 255 - image


class PilMirror:
    """A user's op on PIL images."""

    def __call__(self, image):
        return image.transpose(0)  # PIL.Image.Transpose.FLIP_LEFT_RIGHT


class Resize64(torch.nn.Module):
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image[:, :64, :64]


def _labels(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("tvrecipes"))


def recipes() -> dict[str, object]:
    return {
        "timm": timm_data.create_transform(224, is_training=True),
        # DeiT III's recipe: timm's "3a" AutoAugment, then ColorJitter (timm keeps it for 3a)
        "timm_3a": timm_data.create_transform(224, is_training=True, auto_augment="3a"),
        "tv_v2": V.Compose([V.RandomResizedCrop(224), V.RandomHorizontalFlip(),
                            V.TrivialAugmentWide(), V.ToImage(),
                            V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD),
                            V.RandomErasing(0.1)]),
        "randaugment": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                  T.RandAugment(2, 9), T.ToTensor(), T.Normalize(MEAN, STD)]),
        "tensor_op": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                T.PILToTensor(), Negate(), T.ConvertImageDtype(torch.float32),
                                T.Normalize(MEAN, STD)]),
    }


@pytest.mark.parametrize("name", list(recipes()))
def test_each_recipe_runs_on_the_fast_path_and_explain_says_where(root, name):
    recipe = recipes()[name]
    text = gpufeed.explain(recipe)
    assert text.startswith("torchvision pipeline -> gpufeed fast path"), text
    labels = _labels(text)
    assert len(labels) == len(recipe.transforms), text  # one line per op
    assert set(labels) <= {"fast", "tensor", "float"}, text
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        ds = ImageFolder(root, transform=recipe)
    assert isinstance(ds.transform, TorchvisionPipeline)
    loader = FastLoader(ds, batch_size=4, num_workers=0, seed=1)
    assert loader._image_path
    images, labels_ = next(iter(loader))
    assert images.shape == (4, 3, 224, 224) and images.dtype == torch.float32


@pytest.mark.parametrize("op", [T.RandomHorizontalFlip(p=0.3), T.ColorJitter(0.4),
                                V.RandomVerticalFlip(), T.Grayscale(num_output_channels=3)],
                         ids=["flip-p0.3", "color-jitter", "vflip", "grayscale3"])
def test_ops_that_used_to_leave_the_fast_path_now_stay_on_it(root, op):
    text = gpufeed.explain(T.Compose([T.RandomResizedCrop(64), op, T.ToTensor()]))
    assert text.startswith("torchvision pipeline -> gpufeed fast path"), text
    assert _labels(text)[1] in ("fast", "tensor"), text


@pytest.mark.parametrize("pipeline,kind,interpolation", [
    (T.Compose([T.RandomResizedCrop(64, interpolation=T.InterpolationMode.BICUBIC),
                T.ToTensor()]), gpufeed.RandomResizedCrop, "bicubic"),
    (timm_data.create_transform(64, is_training=True, interpolation="random"),
     gpufeed.RandomResizedCrop, "random"),
    (T.Compose([T.Resize(256, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224),
                T.ToTensor()]), gpufeed.ResizeCenterCrop, "bicubic"),
    (V.Compose([V.Resize((120, 80)), V.PILToTensor()]), gpufeed.image.Resize, "auto"),
], ids=["rrc-bicubic", "timm-random", "resize-bicubic", "resize-hw"])
def test_geometry_that_used_to_leave_the_fast_path_is_translated(pipeline, kind, interpolation):
    pipe = gpufeed.from_torchvision(pipeline)
    assert type(pipe.geometry) is kind and pipe.geometry.interpolation == interpolation


def test_an_unknown_tensor_op_runs_as_given_on_the_row(root):
    plain = ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(96),
                                                   T.RandomHorizontalFlip(), T.PILToTensor()]))
    ours = ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(),
                                                  T.PILToTensor(), Negate()]))
    line = gpufeed.explain(ours.transform).splitlines()[4]
    assert line.split()[0] == "tensor" and "Negate()" in line and "uint8 (3, H, W)" in line
    for i in (0, 3, 7):
        torch.testing.assert_close(ours[i][0], 255 - plain[i][0], rtol=0, atol=0)


def test_a_random_torchvision_op_draws_from_seed_epoch_index(root):
    rotate = V.RandomPerspective(0.4, p=1.0)  # no gpufeed op: a tensor op
    plain = ImageFolder(root, transform=V.Compose([V.RandomResizedCrop(96), V.PILToTensor()]))
    ours = ImageFolder(root, transform=V.Compose([V.RandomResizedCrop(96), V.PILToTensor(), rotate]))
    assert _labels(gpufeed.explain(ours.transform))[2] == "tensor"
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        ours.set_epoch(epoch)
        for i in (0, 5):
            op_seed = int(row_rng(0, epoch, i, ROW_STREAM).integers(0, 1 << 63))
            with seeded(op_seed):
                want = rotate(plain[i][0])
            torch.testing.assert_close(ours[i][0], want.as_subclass(torch.Tensor), rtol=0, atol=0)


def test_an_op_between_totensor_and_normalize_sees_floats_within_half_a_level(root):
    jitter = T.ColorJitter(brightness=(0.5, 0.5))  # deterministic: factor 0.5
    plain = ImageFolder(root, transform=T.Compose([T.Resize(128), T.CenterCrop(112), T.ToTensor()]))
    ours = gpufeed.from_torchvision(T.Compose([T.Resize(128), T.CenterCrop(112), T.ToTensor(),
                                               T.Lambda(lambda x: x * 0.5)]))
    line = gpufeed.explain(ours).splitlines()[4]
    assert line.split()[0] == "tensor" and "float32 0-1" in line
    ds = ImageFolder(root, transform=ours)
    for i in (0, 2):
        diff = (ds[i][0] - jitter(plain[i][0])).abs().max().item()
        assert diff <= 0.5 / 255 + 1e-6, diff


def test_an_op_after_normalize_runs_on_the_normalized_float_row(root):
    ours = ImageFolder(root, transform=T.Compose([
        T.Resize(128), T.CenterCrop(112), T.ToTensor(), T.Normalize(MEAN, STD),
        T.Lambda(lambda x: x.clamp(-1.0, 1.0))]))
    assert _labels(gpufeed.explain(ours.transform))[-1] == "float"
    images, _ = next(iter(FastLoader(ours, batch_size=3, num_workers=0)))
    assert images.min().item() >= -1.0 and images.max().item() <= 1.0
    assert (images.abs() == 1.0).float().mean().item() > 0.01  # the clamp ran on the batch


@pytest.mark.timeout(180)
def test_batches_are_the_same_for_any_num_workers(root):
    recipe = V.Compose([V.RandomResizedCrop(64), V.RandomHorizontalFlip(), V.ToImage(),
                        V.RandomRotation(20), V.RandomAffine(10, (0.1, 0.1)), Negate(),
                        V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD),
                        V.RandomErasing(0.5)])
    ds = ImageFolder(root, transform=recipe)
    runs = []
    for workers in (0, 1, 2):
        loader = FastLoader(ds, batch_size=4, num_workers=workers, shuffle=True, seed=5,
                            generator=torch.Generator().manual_seed(3), timeout=60)
        runs.append(torch.cat([images for images, _ in loader]))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    torch.testing.assert_close(runs[0], runs[2], rtol=0, atol=0)


@pytest.mark.parametrize("op,why", [
    (T.Lambda(lambda img: img), "Lambda needs a PIL image"),
    (PilMirror(), "is given a PIL image in this pipeline"),
], ids=["lambda", "callable-before-totensor"])
def test_a_pil_only_op_leaves_the_fast_path_with_one_warning_naming_it(root, op, why):
    pipeline = T.Compose([T.RandomResizedCrop(64), op, T.ToTensor()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolder(root, transform=pipeline)
        loader = FastLoader(ds, batch_size=2, num_workers=0)
        next(iter(loader))
        next(iter(loader))
    ours = [w for w in caught if issubclass(w.category, gpufeed.GpufeedWarning)]
    # one from the dataset (it runs the pipeline as given under any loader), one from the loader
    assert len(ours) == 2, [str(w.message) for w in caught]
    for warning in ours:
        message = str(warning.message)
        assert type(op).__name__ in message and why in message and "gpufeed.explain" in message
        assert warning.filename == __file__  # points at the user's line
    assert "this loader of ImageFolder takes the generic path" in str(ours[1].message)
    assert ds.transform is pipeline and not loader._image_path


def test_an_op_that_changes_the_row_shape_is_a_clear_error(root):
    ds = ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(96), T.PILToTensor(),
                                                Resize64()]))
    with pytest.raises(ValueError, match=r"Resize64\(\) changed the row's shape from "
                                         r"\(3, 96, 96\) to \(3, 64, 64\)"):
        ds[0]


def test_timm_pipelines_are_recognised(root):
    pipe = gpufeed.from_torchvision(timm_data.create_transform(160, is_training=True))
    assert pipe.output_size == (160, 160) and pipe.dtype == torch.float32
    assert pipe.normalize is not None
    torch.testing.assert_close(torch.tensor(pipe.normalize[0]), torch.tensor(MEAN))


def _translated(op, *, before=(), after=()):
    """gpufeed's op for ``op`` placed after RandomResizedCrop (+ ``before``), then ``after``."""
    pipe = gpufeed.from_torchvision(T.Compose([T.RandomResizedCrop(64), *before, op, *after]))
    ours = [*pipe.ops, *pipe.float_ops]
    assert len(ours) == 1, gpufeed.explain(pipe)
    return ours[0]


def _same_parameters():
    import gpufeed.image.augment as A

    BILINEAR = T.InterpolationMode.BILINEAR
    to_float = (T.ToTensor(), T.Normalize(MEAN, STD))
    return [  # (torchvision/timm op, ops before it, ops after it, gpufeed's op with the same parameters)
        (T.ColorJitter(0.4, 0.3, 0.2, 0.1), (), (T.ToTensor(),), A.ColorJitter(0.4, 0.3, 0.2, 0.1)),
        (V.ColorJitter(brightness=(0.5, 1.2), hue=(-0.2, 0.3)), (), (V.PILToTensor(),),
         A.ColorJitter(brightness=(0.5, 1.2), hue=(-0.2, 0.3))),
        (T.RandomGrayscale(0.2), (), (T.ToTensor(),), A.RandomGrayscale(0.2)),
        (T.GaussianBlur(5, (0.3, 1.5)), (), (T.ToTensor(),), A.GaussianBlur(5, (0.3, 1.5))),
        (V.GaussianBlur((3, 7), 0.8), (), (V.PILToTensor(),), A.GaussianBlur((3, 7), 0.8)),
        (T.RandomSolarize(100, 0.3), (), (T.ToTensor(),), A.RandomSolarize(100, 0.3)),
        (T.RandomSolarize(0.5, 0.3), (T.ToTensor(),), (), A.RandomSolarize(127.5, 0.3)),  # on 0-1
        (T.RandomPosterize(3, 0.4), (), (T.ToTensor(),), A.RandomPosterize(3, 0.4)),
        (T.RandomEqualize(0.3), (), (T.ToTensor(),), A.RandomEqualize(0.3)),
        (V.RandomAutocontrast(0.2), (), (V.PILToTensor(),), A.RandomAutocontrast(0.2)),
        (T.RandomInvert(0.1), (), (T.ToTensor(),), A.RandomInvert(0.1)),
        (T.RandomAdjustSharpness(2.5, 0.6), (), (T.ToTensor(),), A.RandomAdjustSharpness(2.5, 0.6)),
        (T.RandomHorizontalFlip(0.3), (), (T.ToTensor(),), A.RandomHorizontalFlip(0.3)),
        (V.RandomVerticalFlip(0.7), (), (V.PILToTensor(),), A.RandomVerticalFlip(0.7)),
        (T.RandomRotation(15, fill=[10, 20, 30]), (), (T.ToTensor(),),
         A.RandomRotation((-15.0, 15.0), "nearest", (10, 20, 30))),
        (T.RandomAffine(20, (0.1, 0.2), (0.8, 1.2), 10, fill=[1, 2, 3]), (), (T.ToTensor(),),
         A.RandomAffine((-20.0, 20.0), (0.1, 0.2), (0.8, 1.2), (-10.0, 10.0), "nearest", (1, 2, 3))),
        (V.RandomAffine(5, shear=(1, 2, 3, 4), interpolation=BILINEAR), (), (V.PILToTensor(),),
         A.RandomAffine(5, shear=(1, 2, 3, 4), interpolation="bilinear")),
        (T.TrivialAugmentWide(21), (), (T.ToTensor(),), A.TrivialAugmentWide(21)),
        (V.RandAugment(3, 7, 21, interpolation=BILINEAR, fill=[128, 128, 128]), (),
         (V.PILToTensor(),), A.RandAugment(3, 7, 21, "bilinear", (128, 128, 128))),
        (T.AutoAugment(), (), (T.ToTensor(),), A.AutoAugment("imagenet")),
        (T.RandomErasing(0.25, (0.05, 0.2), (0.5, 2.0), value=0.5), to_float, (),
         A.RandomErasing(0.25, (0.05, 0.2), (0.5, 2.0), 0.5)),
        (V.RandomErasing(0.1), to_float, (), A.RandomErasing(0.1)),
        (timm_data.rand_augment_transform("rand-m7-n3-mstd0.5-inc1", {"translate_const": 100}),
         (), (T.ToTensor(),),
         A.TimmRandAugment.from_config("rand-m7-n3-mstd0.5-inc1", translate_const=100)),
        (T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), (), (T.ToTensor(),),
         A.RandomApply((A.ColorJitter(0.4, 0.4, 0.4, 0.1),), 0.8)),
        (V.RandomApply([V.GaussianBlur(5), V.RandomGrayscale(1.0)], p=0.3), (V.PILToTensor(),), (),
         A.RandomApply((A.GaussianBlur(5), A.RandomGrayscale(1.0)), 0.3)),
        (T.RandomChoice([T.RandomSolarize(100, 1.0), T.RandomInvert(1.0)], p=[1, 3]), (),
         (T.ToTensor(),), A.RandomChoice((A.RandomSolarize(100, 1.0), A.RandomInvert(1.0)), (1, 3))),
        (T.RandomChoice([T.RandomEqualize(1.0), T.RandomInvert(1.0)]), (), (T.ToTensor(),),
         A.RandomChoice((A.RandomEqualize(1.0), A.RandomInvert(1.0)))),
        (V.RandomChoice([V.RandomEqualize(1.0), V.TrivialAugmentWide()]), (), (V.PILToTensor(),),
         A.RandomChoice((A.RandomEqualize(1.0), A.TrivialAugmentWide()), (0.5, 0.5))),
        (V.RandomOrder([V.RandomEqualize(0.5), V.ColorJitter(0.2), V.RandomInvert(0.1)]), (),
         (V.PILToTensor(),),
         A.RandomOrder((A.RandomEqualize(0.5), A.ColorJitter(0.2), A.RandomInvert(0.1)))),
        (T.RandomApply([T.RandomOrder([T.RandomEqualize(0.5), T.RandomInvert(0.2)])], p=0.4), (),
         (T.ToTensor(),),
         A.RandomApply((A.RandomOrder((A.RandomEqualize(0.5), A.RandomInvert(0.2))),), 0.4)),
        (timm_data.auto_augment_transform("original-mstd0.5", {"translate_const": 100}),
         (), (T.ToTensor(),),
         A.TimmAutoAugment.from_config("original-mstd0.5", translate_const=100)),
        (timm_data.auto_augment_transform("3a", {"translate_const": 100}), (), (T.ToTensor(),),
         A.TimmAutoAugment.from_config("3a", translate_const=100)),
        (timm_data.rand_augment_transform("rand-m9-mstd0.5-t3a", {"translate_const": 100}), (),
         (T.ToTensor(),), A.TimmRandAugment.from_config("rand-m9-mstd0.5-t3a", translate_const=100)),
        (timm_data.rand_augment_transform("rand-m9-mstd0.5-inc1-t3aw", {"translate_const": 100}),
         (), (T.ToTensor(),),
         A.TimmRandAugment.from_config("rand-m9-mstd0.5-inc1-t3aw", translate_const=100)),
        (timm_data.random_erasing.RandomErasing(0.3, mode="pixel", max_count=3, device="cpu"),
         to_float, (), A.TimmRandomErasing(0.3, mode="pixel", max_count=3)),
    ]


_CASES = _same_parameters()


@pytest.mark.parametrize("op,before,after,want", _CASES,
                         ids=[f"{type(c[0]).__module__.split('.')[0]}-{type(c[0]).__name__}-{k}"
                              for k, c in enumerate(_CASES)])
def test_translation_keeps_the_parameters(op, before, after, want):
    got = _translated(op, before=before, after=after)
    assert got == want, (op, got, want)


def test_a_container_of_an_op_gpufeed_does_not_know_runs_as_a_tensor_op():
    from gpufeed.image._tensor_ops import TensorOp

    container = V.RandomApply([V.RandomEqualize(1.0), Negate()], p=0.5)
    pipe = gpufeed.from_torchvision(V.Compose([V.RandomResizedCrop(64), V.PILToTensor(), container]))
    assert len(pipe.ops) == 1 and isinstance(pipe.ops[0], TensorOp) and pipe.ops[0].fn is container
    assert gpufeed.explain(pipe).splitlines()[-1].split()[0] == "tensor"


def test_explain_lists_the_ops_of_a_gpufeed_transform():
    import gpufeed.image.augment as A
    from gpufeed.image._tensor_ops import TensorOp

    transform = gpufeed.RandomResizedCrop(64, ops=(A.ColorJitter(0.4), TensorOp(Negate())),
                                          float_ops=(A.RandomErasing(0.2),))
    lines = gpufeed.explain(transform).splitlines()
    assert lines[0].startswith("gpufeed transform RandomResizedCrop: fast path")
    assert [line.split()[0] for line in lines[1:]] == ["fast", "tensor", "fast"]
    assert "ColorJitter" in lines[1] and "Negate()" in lines[2] and "RandomErasing" in lines[3]


def test_a_half_flip_before_the_crop_or_without_random_crop_stays_fast(root):
    import gpufeed.image.augment as A

    before = gpufeed.from_torchvision(T.Compose([T.RandomHorizontalFlip(), T.RandomResizedCrop(64),
                                                 T.ToTensor()]))
    assert before.geometry.flip and before.ops == ()
    for ops in ([T.RandomHorizontalFlip(), T.Resize(80), T.CenterCrop(64)],
                [T.Resize(80), T.CenterCrop(64), T.RandomHorizontalFlip()]):
        pipe = gpufeed.from_torchvision(T.Compose([*ops, T.PILToTensor()]))
        assert pipe.ops == (A.RandomHorizontalFlip(0.5),)
        plain = ImageFolder(root, transform=T.Compose([T.Resize(80), T.CenterCrop(64),
                                                       T.PILToTensor()]))
        flipped = ImageFolder(root, transform=pipe)
        seen = {torch.equal(flipped[i][0], plain[i][0].flip(-1)) for i in range(8)}
        assert all(torch.equal(flipped[i][0], plain[i][0]) or
                   torch.equal(flipped[i][0], plain[i][0].flip(-1)) for i in range(8))
        assert seen == {True, False}  # some flipped, some not


def test_timm_3a_recipe_runs_its_policy_in_the_workers():
    import gpufeed.image.augment as A

    recipe = timm_data.create_transform(224, is_training=True, auto_augment="3a")
    pipe = gpufeed.from_torchvision(recipe)
    assert [type(op) for op in pipe.ops] == [A.TimmAutoAugment, A.ColorJitter]
    assert pipe.ops[0].policy == A.TimmAutoAugment("3a").policy
    assert pipe.ops[0].fill == (124, 116, 104)  # timm's img_mean from ImageNet's mean
    lines = gpufeed.explain(recipe).splitlines()
    aa = next(line for line in lines if "AutoAugment(policy=" in line)
    assert aa.split()[0] == "fast" and "in the worker" in aa, aa
