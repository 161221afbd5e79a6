"""torchvision v2 detection/segmentation pipelines translated to a ``DetectionPipeline``
(``gpufeed.image.detection._translate``): the references' presets translate, ops gpufeed has
no joint op for run as given (seeded), PIL-only pipelines are not translated, and with every op
as given the translation returns exactly what torchvision's pipeline returns (the conversions
Sample <-> tv_tensors and the output stage).

Real torchvision (``make test`` runs this folder in ``.venv-tv``); the presets are re-created in
benchmarks/_presets.py (the benchmarks run them too).
"""

from __future__ import annotations

import pickle
import random
import warnings

import numpy as np
import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

import torchvision.transforms as T1  # noqa: E402
import torchvision.transforms.v2 as T  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from benchmarks._presets import (  # noqa: E402
    DetectionPresetEval,
    DetectionPresetTrain,
    FixedSizeCrop,
    PadIfSmaller,
    SegmentationPresetEval,
    SegmentationPresetTrain,
)
from gpufeed.image.detection import Boxes, KeyPoints, Mask, Sample  # noqa: E402
from gpufeed.image.detection._as_given import AsGiven, from_torchvision, to_torchvision  # noqa: E402
from gpufeed.image.detection._refs import PadIfSmaller as GfPadIfSmaller  # noqa: E402
from gpufeed.image.detection._translate import (  # noqa: E402
    JOINT_OPS,
    _flatten,
    build_joint,
    translate_detection,
)

POLICIES = ("hflip", "ssd", "ssdlite", "multiscale", "lsj")
BACKENDS = ("pil", "tensor", "tv_tensor")
STAGE = ("ToImage", "PILToTensor", "ToDtype", "Normalize", "ToPureTensor")


def _detection_sample(seed: int, h: int = 60, w: int = 80, masks: bool = True):
    """(Sample, PIL image, torchvision target) of the same random image and target."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    n = 5
    x0, y0 = rng.uniform(0, w - 10, n), rng.uniform(0, h - 10, n)
    boxes = np.stack([x0, y0, x0 + rng.uniform(2, 30, n), y0 + rng.uniform(2, 30, n)], 1)
    boxes = np.minimum(boxes, [w, h, w, h]).astype(np.float32)
    labels = torch.from_numpy(rng.integers(1, 91, n))
    planes = (rng.random((n, h, w)) > 0.6).astype(np.uint8)
    target = {"boxes": Boxes(boxes.astype(np.float64), "XYXY", (h, w)), "labels": labels.clone()}
    tv_target = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY",
                                                   canvas_size=(h, w)),
                 "labels": labels.clone()}
    if masks:
        target["masks"] = Mask(data=planes.copy())
        tv_target["masks"] = tv_tensors.Mask(torch.from_numpy(planes.copy()))
    return Sample(img, target), Image.fromarray(img), tv_target


def _segmentation_sample(seed: int, h: int = 50, w: int = 70):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mask = rng.integers(0, 21, (h, w), dtype=np.uint8)
    return (Sample(img, Mask(data=mask.copy())), Image.fromarray(img),
            tv_tensors.Mask(torch.from_numpy(mask.copy())))


def _reference(pipeline, translated, image, target, seed: int):
    """torchvision's pipeline, op by op, each op translated as given seeded as ``AsGiven``
    seeds it (one draw per op from the sample's generator), the rest called plainly."""
    given = [j.op for j in translated.ops if isinstance(j, AsGiven)]
    rng = np.random.default_rng(seed)
    for op in _flatten(pipeline):
        if any(op is g for g in given):
            s = int(rng.integers(0, 2**63 - 1))
            torch.manual_seed(s)
            random.seed(s)
        image, target = op(image, target)
    return image, target


def _ours(translated, sample, seed: int):
    return translated.output(translated.run(sample, np.random.default_rng(seed)))


def _assert_same(got, want) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _assert_same(got[k], want[k])
        return
    assert type(got) is type(want), (type(got), type(want))
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    assert torch.equal(got, want)


def _reference_input(translated, pil, backend: str):
    """What the pipeline is fed for the comparison: the PIL image where the first op converts
    it; a tensor where ops before the conversion would resample a PIL image otherwise (gpufeed
    runs them on tensors): the type the pipeline's own conversion gives."""
    if backend != "pil":
        return pil
    chw = torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).contiguous()
    return chw if translated.plain_image else tv_tensors.Image(chw)


def _expected_where(name: str, op) -> str:
    joint, _ = build_joint(name, op, JOINT_OPS)
    return "fast" if joint is not None else "tensor (as given)"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_train_preset_translates(policy, backend):
    preset = DetectionPresetTrain(data_augmentation=policy, backend=backend)
    translated, report = translate_detection(preset)
    assert translated is not None, report
    assert report.startswith("detection pipeline translated")
    assert translated.pure and translated.image_dtype == torch.float32 and translated.scale
    assert translated.normalize is None
    for op in _flatten(preset):
        name = type(op).__name__
        if name in STAGE:
            assert f"{name}: fast" in report
        elif name == "FixedSizeCrop":
            kind = "pil" if backend == "pil" else "tensor"
            assert f"FixedSizeCrop: {kind} (as given)" in report
        else:
            assert f"{name}: {_expected_where(name, op)}" in report, (name, report)
    lines = translated.describe()
    assert len(lines) == len(translated.ops) + 1 and lines[-1].startswith("output: image float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_eval_preset_is_the_output_stage(backend):
    translated, report = translate_detection(DetectionPresetEval(backend=backend))
    assert translated is not None and translated.ops == ()
    assert "3 of 3 ops fast" in report
    assert translated.plain_image == (backend == "tensor")


@pytest.mark.parametrize("backend", BACKENDS)
def test_segmentation_presets_translate(backend):
    translated, report = translate_detection(
        SegmentationPresetTrain(base_size=64, crop_size=48, backend=backend))
    assert translated is not None, report
    assert translated.mask_dtype == torch.int64 and translated.normalize is not None
    assert "PadIfSmaller: fast" in report  # the references' class, recognised by shape
    assert isinstance(translated.ops[2], GfPadIfSmaller)
    evaluated, report = translate_detection(SegmentationPresetEval(base_size=64, backend=backend))
    assert evaluated is not None, report
    assert evaluated.mask_dtype is None and evaluated.normalize == (
        (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_detection_train_all_as_given_equals_torchvision(policy, backend):
    if policy == "lsj" and backend == "pil":
        pytest.skip("FixedSizeCrop's tuple fill takes PIL images only: covered below")
    kwargs = {"mean": 0} if policy == "lsj" else {}  # a fill the references' crop pads tensors with
    preset = DetectionPresetTrain(data_augmentation=policy, backend=backend, **kwargs)
    translated, report = translate_detection(preset, table={})
    assert translated is not None, report
    assert all(isinstance(op, AsGiven) for op in translated.ops)
    assert "fast: gpufeed joint op" not in report
    size = (300, 400) if policy == "lsj" else (60, 80)
    compared = 0
    for seed in range(6 if policy == "lsj" else 4):
        sample, pil, tv_target = _detection_sample(seed, *size, masks=policy != "lsj")
        try:
            want = _reference(preset, translated, _reference_input(translated, pil, backend),
                              tv_target, seed)
        except ValueError as exc:  # lsj: the references' crop leaves plain tensor boxes when it
            assert policy == "lsj" and "No bounding boxes" in str(exc)  # crops: Sanitize fails
            with pytest.raises(ValueError, match="No bounding boxes"):
                _ours(translated, sample, seed)
            continue
        got = _ours(translated, sample, seed)
        _assert_same(got[0], want[0])
        _assert_same(got[1], want[1])
        compared += 1
    assert compared >= 2


def test_lsj_pil_runs_fixed_size_crop_on_pil_images():
    preset = DetectionPresetTrain(data_augmentation="lsj", backend="pil")
    translated, _ = translate_detection(preset, table={})
    crop = next(op for op in translated.ops if op.name == "FixedSizeCrop")
    assert crop.kind == "pil"
    sample, pil, tv_target = _detection_sample(3, 400, 300, masks=False)
    got = crop.apply(sample, 11)
    torch.manual_seed(11)
    random.seed(11)
    want_img, want_target = FixedSizeCrop((1024, 1024), fill=(123.0, 117.0, 104.0))(pil, tv_target)
    np.testing.assert_array_equal(got.image, np.asarray(want_img))
    np.testing.assert_array_equal(got.target["boxes"].data, want_target["boxes"].numpy())
    assert got.image[-1, -1].tolist() == [123, 117, 104]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False])
def test_segmentation_all_as_given_equals_torchvision(backend, train):
    preset = (SegmentationPresetTrain(base_size=64, crop_size=48, backend=backend) if train
              else SegmentationPresetEval(base_size=40, backend=backend))
    translated, report = translate_detection(preset, table={})
    assert translated is not None, report
    for seed in range(4):
        sample, pil, mask = _segmentation_sample(seed)
        want = _reference(preset, translated, _reference_input(translated, pil, backend), mask, seed)
        got = _ours(translated, sample, seed)
        _assert_same(got[0], want[0])
        _assert_same(got[1], want[1])


def test_pad_if_smaller_native_equals_the_references():
    ref = PadIfSmaller(64, fill={tv_tensors.Mask: 255, "others": 0})
    ours, _ = build_joint("PadIfSmaller", ref, JOINT_OPS)
    assert isinstance(ours, GfPadIfSmaller)
    sample, _, mask = _segmentation_sample(0, 50, 70)
    box = tv_tensors.BoundingBoxes(torch.tensor([[1.0, 2.0, 30.0, 40.0]]), format="XYXY",
                                   canvas_size=(50, 70))
    sample.target = {"mask": sample.target, "boxes": Boxes(np.array([[1.0, 2, 30, 40]]), "XYXY", (50, 70))}
    image = tv_tensors.Image(torch.from_numpy(sample.image.copy()).permute(2, 0, 1))
    want_img, want = ref(image, {"mask": mask, "boxes": box})
    got = ours(sample, np.random.default_rng(0))
    np.testing.assert_array_equal(got.image, want_img.permute(1, 2, 0).numpy())
    np.testing.assert_array_equal(got.target["mask"].dense(), want["mask"].numpy())
    assert got.target["boxes"].canvas == tuple(want["boxes"].canvas_size) == (64, 70)
    assert ours.draw(np.random.default_rng(0), Sample(np.zeros((64, 64, 3), np.uint8), None)) is None


def test_unknown_ops_run_as_given():
    def user_op(image, target):
        return image, target

    pipeline = T.Compose([T.ToImage(), T.Identity(), T.RandomPerspective(p=1.0), user_op,
                          T.RandomEqualize(p=1.0), T.ToDtype(torch.float32, scale=True)])
    translated, report = translate_detection(pipeline)
    assert translated is not None, report
    assert "RandomPerspective: tensor (as given)" in report and "Identity: fast: no-op" in report
    assert "function: tensor (as given): not a torchvision op" in report
    assert isinstance(translated.ops[0], AsGiven) and isinstance(translated.ops[1], AsGiven)
    assert translated.describe()[0].startswith("tensor (as given): AsGiven(RandomPerspective")
    assert translated.image_dtype == torch.float32 and not translated.pure


def test_op_after_the_dtype_conversion_runs_it_as_given():
    pipeline = T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True),
                          T.SanitizeBoundingBoxes(), T.RandomPerspective(p=1.0),
                          T.Normalize([0.5] * 3, [0.25] * 3)])
    translated, report = translate_detection(pipeline)
    assert translated is not None, report
    names = [op.name for op in translated.ops]
    assert names[-3:] == ["ToDtype", "RandomPerspective", "Normalize"]
    assert translated.normalize is None
    sample, pil, tv_target = _detection_sample(5, masks=False)
    want = _reference(pipeline, translated, pil, tv_target, 5)
    got = _ours(translated, sample, 5)
    _assert_same(got[0], want[0])
    _assert_same(got[1], want[1])


def test_to_tensor_then_an_op_as_given():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # v2.ToTensor is deprecated
        pipeline = T.Compose([T.ToTensor(), T.RandomPerspective(p=1.0)])
    translated, report = translate_detection(pipeline)
    assert translated is not None and translated.plain_image, report
    sample, pil, tv_target = _detection_sample(6, masks=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _reference(pipeline, translated, pil, tv_target, 6)
    got = _ours(translated, sample, 6)
    _assert_same(got[0], want[0])
    _assert_same(got[1], want[1])


@pytest.mark.parametrize("pipeline, why", [
    (T.Compose([T.RandomHorizontalFlip()]), "no ToImage/PILToTensor"),
    (T.Compose([T.ToImage(), T.ToPILImage()]), "ToPILImage"),
    (T.Compose([T.Lambda(lambda x: x), T.ToImage()]), "Lambda given a PIL image"),
    (T.Compose([lambda img, tgt: (img, tgt), T.PILToTensor()]), "given a PIL image"),
    (T.Compose([T.ToImage(), T1.RandomHorizontalFlip()]), "(v1) op"),
    (T.Compose([T.ToImage(), T.ToPureTensor(), T.RandomHorizontalFlip()]), "after ToPureTensor"),
    (T.Compose([T.ToDtype(torch.float32), T.ToImage()]), "before the conversion"),
])
def test_pil_only_pipelines_are_not_translated(pipeline, why):
    translated, report = translate_detection(pipeline)
    assert translated is None
    assert report.startswith("detection pipeline runs as given on PIL images") and why in report


def test_a_user_callable_is_not_translated():
    translated, report = translate_detection(lambda img, tgt: (img, tgt))
    assert translated is None and "not a torchvision v2 pipeline" in report


def test_lambda_after_the_conversion_runs_as_given():
    translated, report = translate_detection(T.Compose([T.ToImage(), T.Lambda(lambda x: x)]))
    assert translated is not None and "Lambda: tensor (as given)" in report


def test_plain_image_and_tv_tensors_output():
    translated, _ = translate_detection(T.Compose([T.PILToTensor()]))
    assert translated is not None and translated.image_dtype == torch.uint8
    sample, pil, tv_target = _detection_sample(0)
    image, target = _ours(translated, sample, 0)
    want_image, want = T.Compose([T.PILToTensor()])(pil, tv_target)
    _assert_same(image, want_image)
    _assert_same(target, want)
    assert target["boxes"].canvas_size == (60, 80) and target["boxes"].format.name == "XYXY"


@pytest.mark.parametrize("conversion", [T.PILToTensor, T.ToImage])
@pytest.mark.parametrize("key", [tv_tensors.Image, torch.Tensor])
def test_a_dtype_dict_converts_the_image_by_its_own_type(conversion, key):
    """``ToDtype({Image or Tensor: float32, Mask: int64, "others": None})``: after
    ``PILToTensor`` the image is a plain tensor, which torchvision converts by the Tensor key
    only ("others": None leaves it uint8); after ``ToImage`` by the Image key only."""
    pipeline = T.Compose([conversion(), T.ToDtype({key: torch.float32, tv_tensors.Mask: torch.int64,
                                                   "others": None}, scale=True)])
    translated, _ = translate_detection(pipeline)
    assert translated is not None
    sample, pil, tv_target = _detection_sample(2)
    image, target = _ours(translated, sample, 0)
    want_image, want = pipeline(pil, tv_target)
    assert image.dtype == want_image.dtype and target["masks"].dtype == want["masks"].dtype == torch.int64
    _assert_same(image, want_image)
    _assert_same(target, want)


@pytest.mark.parametrize("stage", ["pil", "tv_tensor", "tensor"])
@pytest.mark.parametrize("key", [tv_tensors.Image, torch.Tensor, Image.Image, "others"])
def test_a_fill_dict_fills_the_image_by_its_type_where_the_op_runs(stage, key):
    """torchvision looks a fill dict up by the image's type where the op runs: a PIL image before
    the conversion, an Image after ``ToImage``, a plain tensor after ``PILToTensor``; a key of
    another type leaves the image to "others" (here absent: 0)."""
    zoom = T.RandomZoomOut(fill={key: (123, 117, 104), tv_tensors.Mask: 7}, side_range=(3.0, 3.0), p=1.0)
    ops = {"pil": [zoom, T.PILToTensor()], "tv_tensor": [T.ToImage(), zoom], "tensor": [T.PILToTensor(), zoom]}
    pipeline = T.Compose(ops[stage])
    translated, _ = translate_detection(pipeline)
    assert translated is not None
    sample, pil, tv_target = _detection_sample(3)
    image, target = _ours(translated, sample, 0)
    want_image, want = pipeline(pil, tv_target)
    # the zoomed-out canvas is 3x the image: its corners are fill wherever the image lands
    assert image[:, 0, 0].tolist() == want_image[:, 0, 0].tolist()
    assert target["masks"][:, 0, 0].tolist() == want["masks"][:, 0, 0].tolist()
    type_of = {"pil": Image.Image, "tv_tensor": tv_tensors.Image, "tensor": torch.Tensor}
    assert want_image[:, 0, 0].tolist() == ([123, 117, 104] if key in ("others", type_of[stage]) else [0, 0, 0])


def test_conversions_round_trip():
    sample, _, _ = _detection_sample(1)
    sample.target["points"] = KeyPoints(np.array([[1.5, 2.5], [3.0, 4.0]]), canvas=(60, 80))
    for kind in ("image", "tensor", "pil"):
        image, target = to_torchvision(sample, kind)
        back = from_torchvision(image, target)
        np.testing.assert_array_equal(back.image, sample.image)
        np.testing.assert_array_equal(back.target["boxes"].data, sample.target["boxes"].data)
        np.testing.assert_array_equal(back.target["masks"].dense(), sample.target["masks"].dense())
        np.testing.assert_array_equal(back.target["points"].data, sample.target["points"].data)
        assert back.target["points"].canvas == (60, 80)


def test_as_given_restores_the_generators():
    torch.manual_seed(123)
    random.seed(7)
    before = torch.rand(3), random.random()
    torch.manual_seed(123)
    random.seed(7)
    op = AsGiven(T.RandomPhotometricDistort(p=1.0))
    sample, _, _ = _detection_sample(2)
    op(sample, np.random.default_rng(0))
    assert torch.equal(torch.rand(3), before[0]) and random.random() == before[1]
    a = op(_detection_sample(2)[0], np.random.default_rng(4)).image
    b = op(_detection_sample(2)[0], np.random.default_rng(4)).image
    np.testing.assert_array_equal(a, b)  # the same sample generator: the same draws


def test_rotated_boxes_run_every_op_as_given():
    pipeline = T.Compose([T.ToImage(), T.RandomHorizontalFlip(p=1.0), T.ToPureTensor()])
    translated, _ = translate_detection(pipeline)
    assert translated is not None and len(translated.fallback) == 1
    rotated = tv_tensors.BoundingBoxes(torch.tensor([[10.0, 20.0, 8.0, 4.0, 30.0]]),
                                       format="CXCYWHR", canvas_size=(60, 80))
    sample, pil, _ = _detection_sample(0, masks=False)
    sample.target = {"boxes": rotated.clone(), "labels": torch.tensor([1])}
    image, target = _ours(translated, sample, 0)
    want_image, want = pipeline(pil, {"boxes": rotated.clone(), "labels": torch.tensor([1])})
    _assert_same(image, want_image)
    _assert_same(target, want)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "ssd"])  # ssd: the preset's
def test_translations_pickle(policy):  # fill is a defaultdict of a lambda (it does not pickle)
    """Workers may receive the pipeline pickled (spawn): the ops, the fallback and the source."""
    translated, _ = translate_detection(DetectionPresetTrain(data_augmentation=policy))
    again = pickle.loads(pickle.dumps(translated))
    assert [type(op).__name__ for op in again.ops] == [type(op).__name__ for op in translated.ops]
    assert len(again.fallback) == len(translated.fallback)
    sample = _detection_sample(0, masks=False)[0]
    if policy != "lsj":
        _assert_same(_ours(again, sample, 1)[0], _ours(translated, _detection_sample(0, masks=False)[0], 1)[0])


def test_keypoint_sanitizing_and_the_clamping_mode_translate_as_gpufeed_ops():
    from gpufeed.image.detection import translate_detection

    pipeline = T.Compose([T.ToImage(), T.SetClampingMode("hard"), T.RandomHorizontalFlip(),
                          T.SanitizeKeyPoints(), T.ToPureTensor()])
    translated, report = translate_detection(pipeline)
    assert translated is not None, report
    assert [type(op).__name__ for op in translated.ops] == [
        "SetClampingMode", "RandomHorizontalFlip", "SanitizeKeyPoints"]
    assert "as given" not in report


def test_a_pil_only_detection_pipeline_is_named_in_the_warning_and_in_explain(tmp_path):
    import warnings

    import gpufeed
    from gpufeed._synth_coco import make_coco

    coco = make_coco(tmp_path, 4, seed=1)
    pipeline = T.Compose([T.ToPILImage(), T.RandomHorizontalFlip(), T.ToImage()])
    dataset = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=pipeline)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpufeed.FastLoader(dataset, batch_size=2, collate_fn=lambda b: tuple(zip(*b)))
    messages = [str(w.message) for w in caught if issubclass(w.category, gpufeed.GpufeedWarning)]
    assert len(messages) == 1 and "ToPILImage" in messages[0], messages
    assert "ToPILImage" in gpufeed.explain(dataset)
